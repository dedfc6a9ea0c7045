//! `--device-map OLD=NEW,...`: restore onto other GPUs (driver r580 / CUDA 13.0).

use super::driver::{GpuPair, GpuUuid};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceMap {
    pairs: Vec<GpuPair>,
}

impl DeviceMap {
    /// Parses `GPU-a=GPU-b,GPU-b=GPU-a`. Each old GPU once, each new GPU once:
    /// the driver restores one GPU's state onto one GPU.
    pub fn parse(text: &str) -> Result<DeviceMap, String> {
        let mut pairs: Vec<GpuPair> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (old, new) = item.split_once('=').ok_or_else(|| format!("{item:?} is not OLD_UUID=NEW_UUID"))?;
            let pair = GpuPair { old: GpuUuid::parse(old.trim())?, new: GpuUuid::parse(new.trim())? };
            if pairs.iter().any(|p| p.old == pair.old) {
                return Err(format!("{} is mapped twice", pair.old));
            }
            if pairs.iter().any(|p| p.new == pair.new) {
                return Err(format!("two GPUs are mapped onto {}", pair.new));
            }
            pairs.push(pair);
        }
        if pairs.is_empty() {
            return Err("empty device map".into());
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
        let bad = [
            (A.to_string(), "not OLD_UUID=NEW_UUID"),
            (format!("{A}={B},{A}={A}"), "mapped twice"),
            (format!("{A}={B},{B}={B}"), "two GPUs are mapped onto"),
            (format!("{A}=GPU-12"), "not a GPU UUID"),
            (String::from(" , "), "empty device map"),
        ];
        for (text, needle) in bad {
            let err = DeviceMap::parse(&text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn an_empty_map_keeps_every_gpu() {
        let a = GpuUuid::parse(A).unwrap();
        let map = DeviceMap::default();
        assert_eq!(map.target(a), a);
        assert!(map.covers(a));
    }
}
