//! Health readings the node checker judges (those DCGM and gpud judge): ECC,
//! retired pages, remapped rows, XIDs, clock event reasons, temperature,
//! power, PCIe link, fabric, processes. Readings a GPU does not support are
//! `None`; other failed readings are listed in `unavailable` rather than
//! hiding the rest. A lost GPU (or one needing reset) fails the whole call.

use super::{raw, GpuError, GpuProcess, NvmlGpus};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold};
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    /// A remap waits for a GPU reset.
    pub pending: bool,
    /// Remapping failed: the GPU needs replacing.
    pub failed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pcie {
    pub current_gen: u32,
    pub max_gen: u32,
    pub current_width: u32,
    pub max_width: u32,
    pub replay_counter: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReadings {
    pub ecc_uncorrected_volatile: Option<u64>,
    pub ecc_uncorrected_aggregate: Option<u64>,
    /// Pages retired for double-bit errors and for repeated single-bit errors.
    pub retired_pages_dbe: Option<u32>,
    pub retired_pages_sbe: Option<u32>,
    pub retired_pages_pending: Option<bool>,
    pub remapped_rows: Option<RemappedRows>,
    /// NVML clocks event (throttle) reasons bitmask; 0x1 is "GPU idle".
    pub clocks_event_reasons: Option<u64>,
    pub clocks_event_reason_names: Vec<String>,
    pub temperature_c: Option<u32>,
    pub slowdown_temp_c: Option<u32>,
    pub shutdown_temp_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub power_limit_mw: Option<u32>,
    pub pcie: Option<Pcie>,
    /// NVML_GPU_FABRIC_STATE_* as text; `None` where there is no fabric.
    pub fabric_state: Option<String>,
    pub processes: Vec<GpuProcess>,
    /// Readings that failed for another reason than "not supported".
    pub unavailable: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct XidEvent {
    pub gpu: u32,
    pub xid: u64,
}

/// Names of the clocks event reason bits, for people reading the report.
const REASON_NAMES: [(u64, &str); 9] = [
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

pub fn reason_names(bits: u64) -> Vec<String> {
    REASON_NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| n.to_string()).collect()
}

fn fabric_state_name(state: u8) -> String {
    match state {
        0 => "not_supported".into(),
        1 => "not_started".into(),
        2 => "in_progress".into(),
        3 => "completed".into(),
        s => format!("unknown({s})"),
    }
}

/// Collects one reading: not supported → `None`; lost/reset/driver errors
/// abort; other errors are noted in `unavailable`.
struct Collector {
    gpu: u32,
    unavailable: Vec<String>,
}

impl Collector {
    fn take<T>(&mut self, call: &'static str, r: Result<T, NvmlError>) -> Result<Option<T>, GpuError> {
        self.take_typed(r.map_err(|e| GpuError::from_wrapper(call, Some(self.gpu), e)))
    }

    fn take_typed<T>(&mut self, r: Result<T, GpuError>) -> Result<Option<T>, GpuError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_supported() => Ok(None),
            Err(e) if e.is_fatal() => Err(e),
            Err(e) => {
                self.unavailable.push(e.to_string());
                Ok(None)
            }
        }
    }
}

impl NvmlGpus {
    pub(super) fn read_health(&self, gpu: u32) -> Result<HealthReadings, GpuError> {
        let d = self.device(gpu)?;
        let mut c = Collector { gpu, unavailable: Vec::new() };
        let unc = MemoryError::Uncorrected;
        let ecc_volatile = c.take("nvmlDeviceGetTotalEccErrors", d.total_ecc_errors(unc, EccCounter::Volatile))?;
        let ecc_aggregate = c.take("nvmlDeviceGetTotalEccErrors", d.total_ecc_errors(unc, EccCounter::Aggregate))?;
        let dbe = c.take("nvmlDeviceGetRetiredPages_v2", d.retired_pages(RetirementCause::DoubleBitEccError))?;
        let sbe = c.take("nvmlDeviceGetRetiredPages_v2", d.retired_pages(RetirementCause::MultipleSingleBitEccErrors))?;
        let pending = c.take("nvmlDeviceGetRetiredPagesPendingStatus", d.are_pages_pending_retired())?;
        // SAFETY: the handle is used while `d` and `self` live.
        let dev = unsafe { d.handle() };
        let rows = c.take_typed(raw::remapped_rows(&self.nvml, dev, gpu))?;
        let reasons = c.take("nvmlDeviceGetCurrentClocksThrottleReasons", d.current_throttle_reasons().map(|r: ThrottleReasons| r.bits()))?;
        let fabric = c.take_typed(raw::fabric_state(&self.nvml, dev, gpu))?;
        Ok(HealthReadings {
            ecc_uncorrected_volatile: ecc_volatile,
            ecc_uncorrected_aggregate: ecc_aggregate,
            retired_pages_dbe: dbe.map(|p| p.len() as u32),
            retired_pages_sbe: sbe.map(|p| p.len() as u32),
            retired_pages_pending: pending,
            remapped_rows: rows.map(|(correctable, uncorrectable, pending, failed)| RemappedRows { correctable, uncorrectable, pending, failed }),
            clocks_event_reasons: reasons,
            clocks_event_reason_names: reasons.map(reason_names).unwrap_or_default(),
            temperature_c: c.take("nvmlDeviceGetTemperature", d.temperature(TemperatureSensor::Gpu))?,
            slowdown_temp_c: c.take("nvmlDeviceGetTemperatureThreshold", d.temperature_threshold(TemperatureThreshold::Slowdown))?,
            shutdown_temp_c: c.take("nvmlDeviceGetTemperatureThreshold", d.temperature_threshold(TemperatureThreshold::Shutdown))?,
            power_mw: c.take("nvmlDeviceGetPowerUsage", d.power_usage())?,
            power_limit_mw: c.take("nvmlDeviceGetEnforcedPowerLimit", d.enforced_power_limit())?,
            pcie: self.read_pcie(&d, &mut c)?,
            fabric_state: fabric.map(|(state, _)| fabric_state_name(state)),
            processes: c.take_typed(self.read_processes(gpu))?.unwrap_or_default(),
            unavailable: c.unavailable,
        })
    }

    fn read_pcie(&self, d: &nvml_wrapper::Device, c: &mut Collector) -> Result<Option<Pcie>, GpuError> {
        let current_gen = c.take("nvmlDeviceGetCurrPcieLinkGeneration", d.current_pcie_link_gen())?;
        let max_gen = c.take("nvmlDeviceGetMaxPcieLinkGeneration", d.max_pcie_link_gen())?;
        let current_width = c.take("nvmlDeviceGetCurrPcieLinkWidth", d.current_pcie_link_width())?;
        let max_width = c.take("nvmlDeviceGetMaxPcieLinkWidth", d.max_pcie_link_width())?;
        let replay_counter = c.take("nvmlDeviceGetPcieReplayCounter", d.pcie_replay_counter())?;
        Ok(match (current_gen, max_gen, current_width, max_width) {
            (Some(current_gen), Some(max_gen), Some(current_width), Some(max_width)) => {
                Some(Pcie { current_gen, max_gen, current_width, max_width, replay_counter: replay_counter.unwrap_or(0) })
            }
            _ => None,
        })
    }

    /// Registers every GPU that supports XID events and collects what arrives
    /// within `window`. NVML only reports events raised after registration.
    pub(super) fn collect_xid_events(&self, window: Duration) -> Result<Vec<XidEvent>, GpuError> {
        let node = |call, e| GpuError::from_wrapper(call, None, e);
        let mut set = self.nvml.create_event_set().map_err(|e| node("nvmlEventSetCreate", e))?;
        let count = self.nvml.device_count().map_err(|e| node("nvmlDeviceGetCount_v2", e))?;
        for gpu in 0..count {
            // A lost GPU (or one needing a reset) is reported by the other
            // readings; the remaining GPUs are still watched.
            let d = match self.device(gpu) {
                Err(GpuError::GpuLost { .. } | GpuError::ResetRequired { .. }) => continue,
                other => other?,
            };
            let supported = super::wrap("nvmlDeviceGetSupportedEventTypes", gpu, d.supported_event_types())?;
            if supported.contains(EventTypes::CRITICAL_XID_ERROR) {
                set = d
                    .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                    .map_err(|e| GpuError::from_wrapper("nvmlDeviceRegisterEvents", Some(gpu), e.error))?;
            }
        }
        let deadline = Instant::now() + window;
        let mut events = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).as_millis() as u32;
            match set.wait(left) {
                Ok(data) => {
                    let gpu = data.device.index().map_err(|e| node("nvmlDeviceGetIndex", e))?;
                    let xid = match data.event_data {
                        Some(nvml_wrapper::enums::event::XidError::Value(v)) => v,
                        _ => 999, // NVML's "unknown XID"
                    };
                    events.push(XidEvent { gpu, xid });
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => return Err(node("nvmlEventSetWait_v2", e)),
            }
            if left == 0 {
                break;
            }
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_bits_are_named() {
        let cases: [(u64, &[&str]); 3] =
            [(0x1, &["gpu_idle"]), (0x60, &["sw_thermal_slowdown", "hw_thermal_slowdown"]), (0, &[])];
        for (bits, want) in cases {
            assert_eq!(reason_names(bits), want, "bits {bits:#x}");
        }
    }
}
