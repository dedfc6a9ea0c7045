//! The whole node at a glance, for `gpu-mode-node-checker inventory`:
//! driver versions and per GPU its inventory, modes, MIG profiles and
//! instances, and health readings. A GPU that cannot be read (lost, needs a
//! reset) gets its error in the report instead of failing the whole report.

use super::{DriverVersions, GpuError, GpuInventory, GpuModes, GpuOps, HealthReadings, MigInstance, MigProfile, XidEvent};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    pub driver: DriverVersions,
    pub gpus: Vec<GpuReport>,
    /// XID events seen while the report was taken.
    pub xid_events: Vec<XidEvent>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    pub index: u32,
    pub inventory: Option<GpuInventory>,
    pub modes: Option<GpuModes>,
    pub mig_profiles: Vec<MigProfile>,
    pub mig_instances: Vec<MigInstance>,
    pub health: Option<HealthReadings>,
    /// Why the GPU could not be read completely.
    pub error: Option<String>,
}

/// Reads everything, waiting `xid_window` for XID events. Fails only when
/// the node itself cannot be read (no library, no driver).
pub fn node_report(ops: &dyn GpuOps, xid_window: Duration) -> Result<NodeReport, GpuError> {
    let driver = ops.driver()?;
    let gpus = (0..ops.count()?).map(|gpu| gpu_report(ops, gpu)).collect();
    let xid_events = match ops.wait_xid_events(xid_window) {
        Ok(events) => events,
        Err(e) if !e.is_fatal() => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(NodeReport { driver, gpus, xid_events })
}

fn gpu_report(ops: &dyn GpuOps, gpu: u32) -> GpuReport {
    let mut r = GpuReport { index: gpu, inventory: None, modes: None, mig_profiles: vec![], mig_instances: vec![], health: None, error: None };
    let result = (|| -> Result<(), GpuError> {
        r.inventory = Some(ops.inventory(gpu)?);
        r.modes = Some(ops.modes(gpu)?);
        r.mig_profiles = ops.mig_profiles(gpu)?;
        r.mig_instances = ops.mig_instances(gpu)?;
        r.health = Some(ops.health(gpu)?);
        Ok(())
    })();
    r.error = result.err().map(|e| e.to_string());
    r
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "n/a".to_string(), |v| v.to_string())
}

impl NodeReport {
    /// A human-readable rendering (the `--json` form is serde's).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let d = &self.driver;
        let _ = writeln!(s, "driver {} (NVML {}, CUDA {}), {} GPU(s)", d.driver, d.nvml, d.cuda, self.gpus.len());
        for g in &self.gpus {
            g.write_text(&mut s);
        }
        let xids: Vec<String> = self.xid_events.iter().map(|e| format!("GPU {} XID {}", e.gpu, e.xid)).collect();
        let _ = writeln!(s, "xid events: {}", if xids.is_empty() { "none".into() } else { xids.join(", ") });
        s
    }
}

impl GpuReport {
    fn write_text(&self, s: &mut String) {
        let _ = writeln!(s, "GPU {}", self.index);
        if let Some(i) = &self.inventory {
            let _ = writeln!(s, "  {} {} bus {} minor {} memory {} MiB cc {}", i.name, i.uuid, i.pci_bus_id, i.minor_number, i.memory_total_mib, i.compute_capability);
        }
        if let Some(m) = &self.modes {
            let mig = m.mig.map_or("unsupported".to_string(), |g| format!("current {} pending {}", g.current, g.pending));
            let _ = writeln!(s, "  compute mode {:?}, persistence {}, MIG {}", m.compute, m.persistence, mig);
        }
        for p in &self.mig_profiles {
            let _ = writeln!(
                s,
                "  profile {:<12} id {:>2} enum {} slices {} max {} memory {} MB SMs {} placements {:?}x{}",
                p.name, p.id, p.profile, p.slices, p.instance_count, p.memory_mb, p.sms, p.placement_starts, p.placement_size
            );
        }
        for i in &self.mig_instances {
            let _ = writeln!(s, "  GPU instance {} profile {} at {}+{}: {:?}", i.gpu_instance, i.profile_id, i.placement_start, i.placement_size, i.compute_instances);
        }
        if let Some(h) = &self.health {
            write_health(s, h);
        }
        if let Some(e) = &self.error {
            let _ = writeln!(s, "  ERROR: {e}");
        }
    }
}

fn write_health(s: &mut String, h: &HealthReadings) {
    let _ = writeln!(
        s,
        "  ECC uncorrected volatile {} aggregate {}; retired pages dbe {} sbe {} pending {}; remapped rows {}",
        opt(&h.ecc_uncorrected_volatile),
        opt(&h.ecc_uncorrected_aggregate),
        opt(&h.retired_pages_dbe),
        opt(&h.retired_pages_sbe),
        opt(&h.retired_pages_pending),
        h.remapped_rows.as_ref().map_or("n/a".into(), |r| format!("{r:?}")),
    );
    let _ = writeln!(
        s,
        "  clocks event reasons {} {:?}; temperature {} C (slowdown {}, shutdown {}); power {} / {} mW",
        h.clocks_event_reasons.map_or("n/a".into(), |r| format!("{r:#x}")),
        h.clocks_event_reason_names,
        opt(&h.temperature_c),
        opt(&h.slowdown_temp_c),
        opt(&h.shutdown_temp_c),
        opt(&h.power_mw),
        opt(&h.power_limit_mw),
    );
    if let Some(p) = &h.pcie {
        let _ = writeln!(s, "  PCIe gen {}/{} width x{}/x{} replays {}", p.current_gen, p.max_gen, p.current_width, p.max_width, p.replay_counter);
    }
    let _ = writeln!(s, "  fabric {}; processes {:?}", opt(&h.fabric_state), h.processes);
    for u in &h.unavailable {
        let _ = writeln!(s, "  unavailable: {u}");
    }
}

/// `gpu-mode-node-checker inventory [--json]`: the report of the GPUs that
/// `config` points at, as text or pretty JSON. Read-only: no setter is called.
pub fn inventory_output(config: &crate::Config, json: bool, xid_window: Duration) -> Result<String, GpuError> {
    let gpus = super::NvmlGpus::from_config(config)?;
    let report = node_report(&gpus, xid_window)?;
    Ok(if json {
        serde_json::to_string_pretty(&report).expect("a report always serializes") + "\n"
    } else {
        report.to_text()
    })
}
