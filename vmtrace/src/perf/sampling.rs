//! Data-address sampling: which memory regions the sampled events hit, as
//! `perf mem` does. Where a PMU exists, vmtrace samples dTLB-missing loads
//! with their data address; the same path runs on software events (page
//! faults carry their address), which is how it is tested on machines
//! without a PMU.
use crate::hash::HashMap;

use perf_event::{
    data::Record as DataRecord,
    events::{Event, Raw},
    Builder, SampleFlag, SampleSkid, Sampler,
};

use super::Scope;
use crate::model::RegionSamples;
use crate::procmaps::{self, Region};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataSample {
    pub pid: u32,
    pub addr: u64,
}

/// Samples counted per region as they arrive (regions come and go, so each
/// sample is placed with the maps of its moment).
#[derive(Default)]
pub struct Attribution {
    counts: HashMap<(u32, u64), (Region, u64)>,
    /// Samples outside every known region of their process.
    pub outside: u64,
}

impl Attribution {
    /// Counts one sample; false when no region holds it.
    pub fn add(&mut self, s: DataSample, regions: &[Region]) -> bool {
        match procmaps::find(regions, s.addr) {
            Some(r) => {
                self.counts.entry((s.pid, r.start)).or_insert_with(|| (r.clone(), 0)).1 += 1;
                true
            }
            None => false,
        }
    }

    /// Regions by samples, most first.
    pub fn into_regions(self) -> Vec<RegionSamples> {
        let mut out: Vec<RegionSamples> = self
            .counts
            .into_iter()
            .map(|((pid, _), (r, n))| RegionSamples {
                pid,
                start: format!("{:#x}", r.start),
                end: format!("{:#x}", r.end),
                kind: r.kind,
                path: r.path.as_deref().map(String::from),
                samples: n,
            })
            .collect();
        out.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.pid.cmp(&b.pid)));
        out
    }
}

/// Attributes a batch of samples against fixed maps (one moment's view).
pub fn attribute<S: std::hash::BuildHasher>(
    samples: &[DataSample],
    maps: &std::collections::HashMap<u32, Vec<Region>, S>,
) -> (Vec<RegionSamples>, u64) {
    let mut a = Attribution::default();
    for &s in samples {
        if !maps.get(&s.pid).is_some_and(|m| a.add(s, m)) {
            a.outside += 1;
        }
    }
    let outside = a.outside;
    (a.into_regions(), outside)
}

/// Intel (Skylake and later) MEM_INST_RETIRED.STLB_MISS_LOADS, precise: loads
/// that missed the second-level TLB, with their data address.
const INTEL_STLB_MISS_LOADS: u64 = 0xd0 | (0x11 << 8);

pub struct DataSampler {
    samplers: Vec<Sampler>,
    attribution: Attribution,
    /// Each sampled process's regions, re-read when a sample falls outside them.
    maps: HashMap<u32, Vec<Region>>,
    pub samples: u64,
    /// Samples the kernel dropped (PERF_RECORD_LOST) because the buffer was full.
    pub lost: u64,
}

impl DataSampler {
    /// Samples `event` every `period` occurrences with the data address.
    pub fn open<E: Event + Clone>(scope: &Scope, event: &E, period: u64, precise: bool) -> std::io::Result<Self> {
        let mut samplers = Vec::new();
        let build = |b: &mut Builder| -> std::io::Result<Sampler> {
            b.sample(SampleFlag::ADDR | SampleFlag::TID).sample_period(period).include_kernel().enabled(true);
            if precise {
                b.precise_ip(SampleSkid::RequestZero);
            }
            b.build()?.sampled(1 << 20)
        };
        match scope {
            Scope::Tasks(tids) => {
                // The kernel refuses to mmap an inherited per-task event on "any
                // CPU" (all children would share one buffer): one per task and CPU.
                let cpus = aya::util::online_cpus().unwrap_or_else(|_| vec![0]);
                for &tid in tids {
                    for &cpu in &cpus {
                        let mut b = Builder::new(event.clone());
                        b.observe_pid(tid as i32).one_cpu(cpu as usize).inherit(true);
                        samplers.push(build(&mut b)?);
                    }
                }
            }
            Scope::Cpus(cpus) => {
                for &cpu in cpus {
                    let mut b = Builder::new(event.clone());
                    b.any_pid().one_cpu(cpu as usize);
                    samplers.push(build(&mut b)?);
                }
            }
        }
        Ok(Self { samplers, attribution: Attribution::default(), maps: HashMap::default(), samples: 0, lost: 0 })
    }

    /// dTLB-miss load sampling where the CPU supports it.
    pub fn open_tlb(scope: &Scope) -> Result<Self, String> {
        if !super::is_intel() {
            return Err("data-address TLB-miss sampling is implemented for Intel PMUs only".into());
        }
        Self::open(scope, &Raw::new(INTEL_STLB_MISS_LOADS), 1000, true).map_err(|e| super::explain(&e))
    }

    /// Moves every pending sample out of the kernel's buffers and attributes it.
    pub fn drain(&mut self) {
        let mut refreshed = crate::hash::HashSet::default();
        for sampler in &mut self.samplers {
            while let Some(rec) = sampler.next_record() {
                let sample = match rec.parse_record() {
                    Ok(DataRecord::Sample(s)) => s,
                    Ok(DataRecord::Lost(l)) => {
                        self.lost += l.lost;
                        continue;
                    }
                    _ => continue,
                };
                let (Some(pid), Some(addr)) = (sample.pid(), sample.addr()) else { continue };
                self.samples += 1;
                let s = DataSample { pid, addr };
                let regions = self.maps.entry(pid).or_insert_with(|| procmaps::read(pid).unwrap_or_default());
                if self.attribution.add(s, regions) {
                    continue;
                }
                // A region newer than our view: read the maps again, once per drain.
                if refreshed.insert(pid) {
                    *regions = procmaps::read(pid).unwrap_or_default();
                    if self.attribution.add(s, regions) {
                        continue;
                    }
                }
                self.attribution.outside += 1;
            }
        }
    }

    /// Samples per region, and how many fell outside every known region.
    pub fn finish(mut self) -> (Vec<RegionSamples>, u64) {
        self.drain();
        let outside = self.attribution.outside;
        (self.attribution.into_regions(), outside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RegionKind;

    #[test]
    fn synthetic_samples_land_in_their_regions() {
        let maps = procmaps::parse(
            "1000-3000 rw-p 00000000 00:00 0 [heap]\n\
             10000-20000 r--s 00000000 fe:01 7 /ckpt/model.safetensors\n",
        );
        let maps: HashMap<u32, Vec<Region>> = [(7, maps)].into_iter().collect();
        let samples = [
            DataSample { pid: 7, addr: 0x1000 },
            DataSample { pid: 7, addr: 0x2fff },
            DataSample { pid: 7, addr: 0x10000 },
            DataSample { pid: 7, addr: 0x18000 },
            DataSample { pid: 7, addr: 0x1ffff },
            DataSample { pid: 7, addr: 0x20000 }, // end is exclusive
            DataSample { pid: 8, addr: 0x1000 },  // unknown process
        ];
        let (regions, outside) = attribute(&samples, &maps);
        assert_eq!(outside, 2);
        assert_eq!(regions.len(), 2);
        assert_eq!((regions[0].kind, regions[0].samples), (RegionKind::File, 3));
        assert_eq!(regions[0].path.as_deref(), Some("/ckpt/model.safetensors"));
        assert_eq!((regions[1].kind, regions[1].samples, regions[1].start.as_str()), (RegionKind::Heap, 2, "0x1000"));
    }
}
