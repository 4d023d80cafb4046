//! The hash maps of the collector and its model. Their keys are pids,
//! addresses, stack ids and names the kernel and /proc give; foldhash
//! (seeded per process) hashes them several times faster than std's
//! SipHash, which was a tenth of the collector's time beside process churn.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
