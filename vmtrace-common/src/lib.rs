//! Types shared by the kernel programs (`vmtrace-ebpf`) and userspace (`vmtrace`).
//!
//! Every type here is `#[repr(C)]` with explicit padding and no `bool`, so both
//! sides agree on the layout byte for byte; each has a compile-time size check.
//! The `user` feature adds `aya::Pod` impls for userspace.
#![no_std]

mod control;
mod events;
mod faults;
mod mm;
mod python;
mod regions;
mod resident;
mod samples;
mod stacks;
mod tpfields;
pub use control::*;
pub use events::*;
pub use faults::*;
pub use mm::*;
pub use python::*;
pub use regions::*;
pub use resident::*;
pub use samples::*;
pub use stacks::*;
pub use tpfields::*;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C), made only of integers, with no implicit padding
    // (checked by the size asserts beside each type).
    unsafe impl aya::Pod for super::FaultStats {}
    unsafe impl aya::Pod for super::InflightFault {}
    unsafe impl aya::Pod for super::UserStack {}
    unsafe impl aya::Pod for super::PyProc {}
    unsafe impl aya::Pod for super::StackKey {}
    unsafe impl aya::Pod for super::StackCounts {}
    unsafe impl aya::Pod for super::StackCur {}
    unsafe impl aya::Pod for super::MmStats {}
    unsafe impl aya::Pod for super::GranuleKey {}
    unsafe impl aya::Pod for super::GranuleCounts {}
    unsafe impl aya::Pod for super::GranuleCur {}
    unsafe impl aya::Pod for super::MapGenSlot {}
    unsafe impl aya::Pod for super::FileKey {}
    unsafe impl aya::Pod for super::FileChunkKey {}
    unsafe impl aya::Pod for super::MmStackKey {}
    unsafe impl aya::Pod for super::MmStackCounts {}
    unsafe impl aya::Pod for super::MmEvent {}
    unsafe impl aya::Pod for super::MmLockEvent {}
    unsafe impl aya::Pod for super::FaultMajorEvent {}
    unsafe impl aya::Pod for super::GranuleNewEvent {}
    unsafe impl aya::Pod for super::EventHeader {}
    unsafe impl aya::Pod for super::TaskEvent {}
    unsafe impl aya::Pod for super::PyStackEvent {}
    unsafe impl aya::Pod for super::OomEvent {}
    unsafe impl aya::Pod for super::StackSampleHead {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::TpOffsets {}
    unsafe impl aya::Pod for super::RssMm {}
    unsafe impl aya::Pod for super::RssEvent {}
    unsafe impl aya::Pod for super::PageSample {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ceil_log2_from_1us() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1024), 0);
        assert_eq!(hist_bucket(1025), 1);
        assert_eq!(hist_bucket(2048), 1);
        assert_eq!(hist_bucket(65_000), 6); // <= 65536
        assert_eq!(hist_bucket(1 << 30), 20);
        assert_eq!(hist_bucket((1 << 30) + 1), HIST_BUCKETS - 1);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn coarse_buckets_step_by_four() {
        assert_eq!(granule_bucket(1000), 0); // <= 1 µs
        assert_eq!(granule_bucket(1025), 1); // <= 4 µs
        assert_eq!(granule_bucket(4096), 1);
        assert_eq!(granule_bucket(4097), 2); // <= 16 µs
        assert_eq!(granule_bucket(65_536), 3); // <= 64 µs
        assert_eq!(granule_bucket(4 << 20), 6); // <= 4 ms
        assert_eq!(granule_bucket(5 << 20), 7); // <= 16 ms
        assert_eq!(granule_bucket(1 << 30), 10); // <= 1.07 s
        assert_eq!(granule_bucket((1 << 30) + 1), 11);
        assert_eq!(granule_bucket(u64::MAX), 11);
    }

    #[test]
    fn event_kinds_round_trip() {
        for k in [
            EventKind::TaskFork,
            EventKind::TaskExec,
            EventKind::TaskExit,
            EventKind::FaultMajor,
            EventKind::MmMapChange,
            EventKind::MmLock,
            EventKind::OomMarkVictim,
            EventKind::StackSample,
            EventKind::PyStackStored,
            EventKind::ResidentPeak,
            EventKind::ResidentEnd,
            EventKind::PageSample,
        ] {
            assert_eq!(EventKind::from_u32(k as u32), Some(k));
        }
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(EventKind::from_u32(99), None);
    }

    #[test]
    fn pages_are_sampled_one_in_period_by_address_whatever_the_pattern() {
        // Sequential pages, pages 16 apart (fault-around windows), and 2 MiB
        // apart (huge-page heads): each 1 in 64 within a few percent.
        for stride in [1u64, 16, 512] {
            for salt in [0u64, 0x1234_5678_9abc_def0, u64::MAX] {
                let n = 1u64 << 16;
                let hit = (0..n).filter(|i| page_sampled(0x0007_f000_0000 + i * stride, salt, 64)).count() as f64;
                let expect = n as f64 / 64.0;
                assert!((hit - expect).abs() < 4.0 * expect.sqrt(), "stride {stride} salt {salt:#x}: {hit} of {n}");
            }
        }
        // The same page is in or out whatever process asks; period 1 takes all.
        assert_eq!(page_sampled(0x1234, 7, 16), page_sampled(0x1234, 7, 16));
        assert!((0..1000).all(|p| page_sampled(p, 99, 1)));
    }

    #[test]
    fn stats_add_sums_every_field() {
        let mut a = FaultStats { started: 1, major: 2, ..Default::default() };
        a.minor_hist[3] = 4;
        let b = a;
        a.merge(&b);
        assert_eq!(a.started, 2);
        assert_eq!(a.major, 4);
        assert_eq!(a.minor_hist[3], 8);
    }
}
