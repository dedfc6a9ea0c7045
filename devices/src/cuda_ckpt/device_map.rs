//! `--device-map OLD=NEW,...`: restore onto other GPUs (driver r580 / CUDA 13.0).

use super::driver::{GpuPair, GpuUuid, UuidError};

/// Why a `--device-map` (or the one a restore builds from its image) cannot
/// be used: the driver restores one GPU's state onto one GPU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceMapError {
    #[error("{item:?} is not OLD_UUID=NEW_UUID")]
    NotAPair { item: String },
    #[error(transparent)]
    Uuid(#[from] UuidError),
    #[error("{old} is mapped twice")]
    OldTwice { old: GpuUuid },
    #[error("two GPUs are mapped onto {new}")]
    NewTwice { new: GpuUuid },
    #[error("empty device map")]
    Empty,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceMap {
    pairs: Vec<GpuPair>,
}

impl DeviceMap {
    /// Parses `GPU-a=GPU-b,GPU-b=GPU-a`. Each old GPU once, each new GPU once:
    /// the driver restores one GPU's state onto one GPU.
    pub fn parse(text: &str) -> Result<DeviceMap, DeviceMapError> {
        let mut pairs: Vec<GpuPair> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (old, new) = item.split_once('=').ok_or_else(|| DeviceMapError::NotAPair { item: item.to_string() })?;
            let pair = GpuPair { old: GpuUuid::parse(old.trim())?, new: GpuUuid::parse(new.trim())? };
            if pairs.iter().any(|p| p.old == pair.old) {
                return Err(DeviceMapError::OldTwice { old: pair.old });
            }
            if pairs.iter().any(|p| p.new == pair.new) {
                return Err(DeviceMapError::NewTwice { new: pair.new });
            }
            pairs.push(pair);
        }
        if pairs.is_empty() {
            return Err(DeviceMapError::Empty);
        }
        Ok(DeviceMap { pairs })
    }

    pub fn pairs(&self) -> &[GpuPair] {
        &self.pairs
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Where the state of `gpu` will be restored.
    pub fn target(&self, gpu: GpuUuid) -> GpuUuid {
        self.pairs.iter().find(|p| p.old == gpu).map_or(gpu, |p| p.new)
    }

    /// `self` completed into a one-to-one map of the dumping node's GPUs
    /// (`old_node`) onto this node's (`new_node`): the GPUs the map leaves
    /// out are paired, in node order, with the targets left free. The driver
    /// wants a pair for *every* GPU the process was checkpointed with, not
    /// only those holding its memory: seen on 2×H200, driver 580, a process
    /// on GPU0 (even with CUDA_VISIBLE_DEVICES=0) restores onto GPU1 with
    /// `GPU0=GPU1,GPU1=GPU0` but `GPU0=GPU1` alone is CUDA_ERROR_INVALID_VALUE.
    /// Left as it is when the nodes' GPU counts differ or either is unknown.
    pub fn completed(&self, old_node: &[GpuUuid], new_node: &[GpuUuid]) -> DeviceMap {
        if self.is_empty() || old_node.len() != new_node.len() {
            return self.clone();
        }
        let mut pairs = self.pairs.clone();
        let free_old = old_node.iter().filter(|g| !self.pairs.iter().any(|p| p.old == **g));
        let mut free_new = new_node.iter().filter(|g| !self.pairs.iter().any(|p| p.new == **g));
        for old in free_old {
            let Some(new) = free_new.next() else { return self.clone() };
            pairs.push(GpuPair { old: *old, new: *new });
        }
        DeviceMap { pairs }
    }

    /// The driver needs a pair for every GPU a process was checkpointed on.
    pub fn covers(&self, gpu: GpuUuid) -> bool {
        self.is_empty() || self.pairs.iter().any(|p| p.old == gpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-00000000-0000-0000-0000-00000000000a";
    const B: &str = "GPU-00000000-0000-0000-0000-00000000000b";

    #[test]
    fn maps_parse_and_bad_ones_name_the_problem() {
        let map = DeviceMap::parse(&format!("{A}={B}, {B}={A}")).unwrap();
        let (a, b) = (GpuUuid::parse(A).unwrap(), GpuUuid::parse(B).unwrap());
        assert_eq!(map.target(a), b);
        assert_eq!(map.target(b), a);
        assert!(map.covers(a) && map.covers(b));
        let bad: [(String, &str, fn(&DeviceMapError) -> bool); 5] = [
            (A.to_string(), "not OLD_UUID=NEW_UUID", |e| matches!(e, DeviceMapError::NotAPair { .. })),
            (format!("{A}={B},{A}={A}"), "mapped twice", |e| matches!(e, DeviceMapError::OldTwice { .. })),
            (format!("{A}={B},{B}={B}"), "two GPUs are mapped onto", |e| matches!(e, DeviceMapError::NewTwice { .. })),
            (format!("{A}=GPU-12"), "not a GPU UUID", |e| matches!(e, DeviceMapError::Uuid(UuidError::Malformed { .. }))),
            (String::from(" , "), "empty device map", |e| *e == DeviceMapError::Empty),
        ];
        for (text, needle, kind) in bad {
            let err = DeviceMap::parse(&text).unwrap_err();
            assert!(err.to_string().contains(needle), "{text}: {err}");
            assert!(kind(&err), "{text}: {err:?}");
        }
    }

    #[test]
    fn a_map_is_completed_into_one_of_the_whole_node() {
        let g = |n: u8| GpuUuid([n; 16]);
        let map = |pairs: &[(u8, u8)]| DeviceMap { pairs: pairs.iter().map(|&(o, n)| GpuPair { old: g(o), new: g(n) }).collect() };
        let node2 = [g(0), g(1)];
        // The failing real case: the job moved from GPU0 to GPU1 on one node.
        assert_eq!(map(&[(0, 1)]).completed(&node2, &node2), map(&[(0, 1), (1, 0)]));
        // 4 GPUs, two of the job's moved onto the two others.
        let node4 = [g(0), g(1), g(2), g(3)];
        assert_eq!(map(&[(0, 2), (1, 3)]).completed(&node4, &node4), map(&[(0, 2), (1, 3), (2, 0), (3, 1)]));
        // Another node: its GPUs pair with ours in order.
        let other = [g(10), g(11)];
        assert_eq!(map(&[(0, 11)]).completed(&node2, &other), map(&[(0, 11), (1, 10)]));
        // Unknown or different node sizes: left as it is; an empty map stays empty.
        assert_eq!(map(&[(0, 1)]).completed(&[], &node2), map(&[(0, 1)]));
        assert_eq!(map(&[(0, 1)]).completed(&node2, &node4), map(&[(0, 1)]));
        assert!(DeviceMap::default().completed(&node2, &node2).is_empty());
    }

    #[test]
    fn an_empty_map_keeps_every_gpu() {
        let a = GpuUuid::parse(A).unwrap();
        let map = DeviceMap::default();
        assert_eq!(map.target(a), a);
        assert!(map.covers(a));
    }
}
