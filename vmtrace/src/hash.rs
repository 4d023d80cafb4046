//! The hash maps of the collector and its model. Their keys are pids,
//! addresses, stack ids and names the kernel and /proc give; foldhash
//! (seeded per process) hashes them several times faster than std's
//! SipHash, which was a tenth of the collector's time beside process churn.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// Gives a table's spare room back once it holds under a quarter of its
/// capacity (tables of 1,024 entries or fewer keep theirs): a table that
/// grew under a burst of processes or stacks otherwise keeps its peak size
/// for the rest of a recording.
pub trait ShrinkSparse {
    fn shrink_if_sparse(&mut self);
}

impl<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher> ShrinkSparse for std::collections::HashMap<K, V, S> {
    fn shrink_if_sparse(&mut self) {
        if self.capacity() > 4 * self.len().max(1024) {
            self.shrink_to_fit();
        }
    }
}

impl<K: Eq + std::hash::Hash, S: std::hash::BuildHasher> ShrinkSparse for std::collections::HashSet<K, S> {
    fn shrink_if_sparse(&mut self) {
        if self.capacity() > 4 * self.len().max(1024) {
            self.shrink_to_fit();
        }
    }
}
