//! The GPU layer against the simulated libnvidia-ml, through nvml-wrapper:
//! the path production uses with the real library.

mod common;

use common::SimNode;
use gpu_mode_core::gpu::*;
use nvml_sim::model::Fault;
use std::time::Duration;

#[test]
fn inventory_and_driver_of_a_two_h200_node() {
    let node = SimNode::new("node-2x-h200.toml");
    let gpus = node.gpus();
    assert_eq!(gpus.count().unwrap(), 2);
    let d = gpus.driver().unwrap();
    assert_eq!((d.driver.as_str(), d.cuda.as_str()), ("580.159.04", "13.0"));
    let (a, b) = (gpus.inventory(0).unwrap(), gpus.inventory(1).unwrap());
    assert_eq!((a.index, b.index, a.minor_number, b.minor_number), (0, 1, 0, 1));
    assert_eq!(a.name, "NVIDIA H200");
    assert_eq!(a.memory_total_mib, 143771);
    assert_eq!(a.compute_capability, "9.0");
    assert_ne!(a.uuid, b.uuid);
    assert!(a.uuid.starts_with("GPU-") && a.pci_bus_id.starts_with("00000000:"), "{a:?}");
}

#[test]
fn modes_at_rest_match_the_real_machines() {
    let node = SimNode::new("node-1x-h100.toml");
    let m = node.gpus().modes(0).unwrap();
    assert_eq!(m.compute, ComputeMode::Default);
    assert!(m.persistence);
    assert_eq!(m.mig, Some(MigModes { current: false, pending: false }));
}

#[test]
fn h200_profile_table_is_the_measured_one() {
    // Read with NVML on a real H200:
    // enum → (id, slices, max instances, memory MB, SMs).
    let measured = [
        (0, 19, 1, 7, 16384, 16),
        (1, 14, 2, 3, 33280, 32),
        (2, 9, 3, 2, 71424, 60),
        (3, 5, 4, 1, 71424, 64),
        (4, 0, 7, 1, 143360, 132),
        (7, 20, 1, 1, 16384, 16),
        (9, 15, 1, 4, 33280, 26),
    ];
    let node = SimNode::new("node-1x-h200.toml");
    let profiles = node.gpus().mig_profiles(0).unwrap();
    let got: Vec<_> = profiles.iter().map(|p| (p.profile, p.id, p.slices, p.instance_count, p.memory_mb, p.sms)).collect();
    assert_eq!(got, measured);
    let starts = |id: u32| profiles.iter().find(|p| p.id == id).unwrap().placement_starts.clone();
    assert_eq!(starts(5), [0], "4g only at slice 0");
    assert_eq!(starts(9), [0, 4], "3g at 0 or 4");
    assert_eq!(starts(14), [0, 2, 4], "2g at 0, 2, 4");
}

#[test]
fn a100_has_its_own_profiles_and_a_fabric() {
    let node = SimNode::new("node-8x-a100.toml");
    let gpus = node.gpus();
    assert_eq!(gpus.count().unwrap(), 8);
    let names: Vec<String> = gpus.mig_profiles(7).unwrap().into_iter().map(|p| p.name).collect();
    assert!(names.contains(&"1g.5gb".to_string()) && names.contains(&"7g.40gb".to_string()), "{names:?}");
    assert_eq!(gpus.health(7).unwrap().fabric_state.as_deref(), Some("completed"));
}

#[test]
fn mig_lifecycle_create_list_destroy() {
    let node = SimNode::new("node-1x-h100.toml");
    let gpus = node.gpus();
    assert_eq!(gpus.set_mig_mode(0, true).unwrap(), MigModeChange::Applied);
    let a = gpus.create_mig_instance(0, 9, None).unwrap(); // 3g.40gb, first free: slice 0
    assert_eq!((a.profile_id, a.placement_start, a.placement_size), (9, 0, 4));
    assert_eq!(a.compute_instances.len(), 1);
    let uuid = a.compute_instances[0].uuid.clone().unwrap();
    assert!(uuid.starts_with("MIG-"), "{uuid}");

    let full = gpus.create_mig_instance(0, 5, None).unwrap_err(); // 4g needs slice 0
    assert_eq!(full.kind(), Some(&ErrorKind::InsufficientResources), "{full}");
    let bad = gpus.create_mig_instance(0, 9, Some(2)).unwrap_err();
    assert!(bad.to_string().contains("cannot start at slice 2"), "{bad}");
    let enum_not_id = gpus.create_mig_instance(0, 2, None).unwrap_err();
    assert!(enum_not_id.to_string().contains("no MIG profile with id 2"), "{enum_not_id}");

    let b = gpus.create_mig_instance(0, 9, Some(4)).unwrap();
    let listed = gpus.mig_instances(0).unwrap();
    assert_eq!(listed, vec![a.clone(), b.clone()]);
    let taken = gpus.create_mig_instance(0, 19, None).unwrap_err();
    assert_eq!(taken.kind(), Some(&ErrorKind::InsufficientResources));

    gpus.destroy_mig_instance(0, a.gpu_instance).unwrap();
    gpus.destroy_mig_instance(0, b.gpu_instance).unwrap();
    assert!(gpus.mig_instances(0).unwrap().is_empty());
    assert_eq!(gpus.set_mig_mode(0, false).unwrap(), MigModeChange::Applied);
}

#[test]
fn minors_that_differ_from_indices_map_slurm_indices_and_keep_handles_right() {
    let node = SimNode::new("node-2x-h200.toml");
    node.edit(|s| {
        s.gpus[0].minor = 1;
        s.gpus[1].minor = 0;
    });
    let gpus = node.gpus();
    let (a, b) = (gpus.inventory(0).unwrap(), gpus.inventory(1).unwrap());
    assert_eq!((a.index, a.minor_number, b.index, b.minor_number), (0, 1, 1, 0));
    assert_eq!((gpus.minor_number(0).unwrap(), gpus.minor_number(1).unwrap()), (1, 0));
    // gres.conf in minor order: Slurm's GPU 0 is /dev/nvidia0, NVML's GPU 1.
    let order = gpu_mode_core::gres::parse_gpu_order("Name=gpu File=/dev/nvidia[0-1]", "/g".as_ref(), "n").unwrap();
    let mapped = slurm_index::map_to_nvml(&order, &[0], || Ok(&gpus as &dyn GpuOps)).unwrap();
    assert_eq!(mapped.nvml, vec![1]);
    // MIG handles name the GPU by index, not minor: instances land on GPU 1.
    assert_eq!(gpus.set_mig_mode(1, true).unwrap(), MigModeChange::Applied);
    let gi = gpus.create_mig_instance(1, 9, None).unwrap();
    assert_eq!(gpus.mig_instances(1).unwrap(), vec![gi.clone()]);
    gpus.destroy_mig_instance(1, gi.gpu_instance).unwrap();
    assert!(gpus.mig_instances(1).unwrap().is_empty());
}

#[test]
fn mig_mode_stays_pending_while_a_process_holds_the_gpu() {
    let node = SimNode::new("node-1x-h200.toml");
    node.add_process(0, 4242);
    let gpus = node.gpus();
    match gpus.set_mig_mode(0, true).unwrap() {
        MigModeChange::Pending { reason } => assert!(reason.contains("in use"), "{reason}"),
        other => panic!("expected pending, got {other:?}"),
    }
    assert_eq!(gpus.modes(0).unwrap().mig, Some(MigModes { current: false, pending: true }));
    assert_eq!(gpus.processes(0).unwrap()[0].pid, 4242);
}

#[test]
fn leave_settings_never_write() {
    let node = SimNode::new("node-1x-h100.toml");
    let gpus = node.gpus();
    assert_eq!(apply_compute_mode(&gpus, 0, ComputeModeSetting::Leave).unwrap(), Applied::Left);
    assert_eq!(gpus.modes(0).unwrap().compute, ComputeMode::Default);
    let err = apply_mig_mode(&gpus, 0, MigModeSetting::Leave, true).unwrap_err();
    assert!(err.to_string().contains("mig_mode = \"leave\""), "{err}");
    assert!(!gpus.modes(0).unwrap().mig.unwrap().pending);
    assert_eq!(apply_mig_mode(&gpus, 0, MigModeSetting::Leave, false).unwrap(), MigApplied::Unchanged);
    assert_eq!(clear_mig_instances(&gpus, 0, MigInstanceSetting::Leave).unwrap(), Applied::Left);
    let err = apply_mig_layout(&gpus, 0, MigInstanceSetting::Leave, &[9]).unwrap_err();
    assert!(err.to_string().contains("mig_instances = \"leave\""), "{err}");
}

#[test]
fn apply_settings_change_what_they_manage() {
    let node = SimNode::new("node-1x-h100.toml");
    let gpus = node.gpus();
    let changed = apply_compute_mode(&gpus, 0, ComputeModeSetting::ExclusiveProcess).unwrap();
    assert_eq!(changed, Applied::Changed { from: ComputeMode::Default, to: ComputeMode::ExclusiveProcess });
    assert_eq!(apply_compute_mode(&gpus, 0, ComputeModeSetting::ExclusiveProcess).unwrap(), Applied::Unchanged);
    assert_eq!(apply_mig_mode(&gpus, 0, MigModeSetting::Switch, true).unwrap(), MigApplied::Changed(MigModeChange::Applied));
    // 1g first then 4g would block the 4g's only placement; the layout
    // creates the largest first, so this fits.
    let made = apply_mig_layout(&gpus, 0, MigInstanceSetting::Manage, &[19, 5]).unwrap();
    let mut ids: Vec<u32> = made.iter().map(|i| i.profile_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [5, 19]);
    assert_eq!(apply_mig_layout(&gpus, 0, MigInstanceSetting::Leave, &[5, 19]).unwrap().len(), 2);
    assert_eq!(clear_mig_instances(&gpus, 0, MigInstanceSetting::Manage).unwrap(), Applied::Changed { from: 2, to: 0 });
    // A layout that cannot fit leaves nothing behind.
    assert!(apply_mig_layout(&gpus, 0, MigInstanceSetting::Manage, &[0, 19]).is_err());
    assert!(gpus.mig_instances(0).unwrap().is_empty());
}

#[test]
fn injected_faults_show_in_health_readings() {
    type Check = fn(&HealthReadings, &GpuModes) -> bool;
    let cases: [(Fault, Check); 7] = [
        (Fault::Ecc { count: 2 }, |h, _| h.ecc_uncorrected_volatile == Some(2) && h.ecc_uncorrected_aggregate == Some(2)),
        (Fault::RemapPending, |h, _| h.remapped_rows.as_ref().is_some_and(|r| r.pending && !r.failed)),
        (Fault::RemapFailed, |h, _| h.remapped_rows.as_ref().is_some_and(|r| r.failed)),
        (Fault::PersistenceOff, |_, m| !m.persistence),
        (Fault::PcieWidth { width: 8 }, |h, _| h.pcie.as_ref().is_some_and(|p| p.current_width == 8 && p.max_width == 16)),
        (Fault::Thermal, |h, _| {
            h.clocks_event_reason_names.contains(&"hw_thermal_slowdown".to_string())
                && h.temperature_c > h.slowdown_temp_c
        }),
        (Fault::MigInUse, |_, _| true),
    ];
    for (fault, check) in cases {
        let node = SimNode::new("node-2x-h200.toml");
        node.inject(1, fault.clone());
        let gpus = node.gpus();
        let (h, m) = (gpus.health(1).unwrap(), gpus.modes(1).unwrap());
        assert!(check(&h, &m), "{fault:?}: {h:?} {m:?}");
        assert!(h.unavailable.is_empty(), "{fault:?}: {:?}", h.unavailable);
        let clean = gpus.health(0).unwrap();
        assert_eq!((clean.ecc_uncorrected_volatile, clean.clocks_event_reasons), (Some(0), Some(1)), "GPU 0 untouched");
    }
}

#[test]
fn retired_pages_where_the_gpu_retires_pages() {
    let node = SimNode::new("node-8x-a100.toml");
    node.inject(2, Fault::RetiredPages { count: 3, pending: true });
    let h = node.gpus().health(2).unwrap();
    assert_eq!((h.retired_pages_dbe, h.retired_pages_sbe, h.retired_pages_pending), (Some(3), Some(0), Some(true)));
    drop(node); // one simulated node at a time
    // Hopper does not retire pages (seen on H200): not supported, not an error.
    let node = SimNode::new("node-1x-h200.toml");
    let h = node.gpus().health(0).unwrap();
    assert_eq!((h.retired_pages_dbe, h.retired_pages_pending), (None, None));
    assert!(h.unavailable.is_empty(), "{:?}", h.unavailable);
}

#[test]
fn mig_in_use_refuses_the_mode_change() {
    let node = SimNode::new("node-1x-h100.toml");
    node.inject(0, Fault::MigInUse);
    assert!(matches!(node.gpus().set_mig_mode(0, true).unwrap(), MigModeChange::Pending { .. }));
}

#[test]
fn a_lost_gpu_is_its_own_error_and_does_not_hide_the_others() {
    let node = SimNode::new("node-2x-h200.toml");
    node.inject(1, Fault::Lost);
    let gpus = node.gpus();
    let err = gpus.inventory(1).unwrap_err();
    assert!(matches!(err, GpuError::GpuLost { .. }), "{err:?}");
    assert!(err.to_string().contains("GPU 1") && err.to_string().contains("lost"), "{err}");
    let report = node_report(&gpus, Duration::ZERO).unwrap();
    assert!(report.gpus[0].error.is_none() && report.gpus[0].health.is_some());
    assert!(report.gpus[1].error.as_deref().unwrap().contains("lost"));
}

#[test]
fn a_gpu_needing_reset_is_its_own_error() {
    let node = SimNode::new("node-1x-h200.toml");
    node.inject(0, Fault::NeedsReset);
    let err = node.gpus().health(0).unwrap_err();
    assert!(matches!(err, GpuError::ResetRequired { .. }), "{err:?}");
}

#[test]
fn xid_events_arrive_through_the_event_set() {
    let node = SimNode::new("node-2x-h200.toml");
    let gpus = node.gpus();
    let state = node.state.clone();
    let injector = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        for (gpu, xid) in [(0, 48), (1, 79), (1, 94)] {
            nvml_sim::store::update(&state, |s| s.inject(gpu, &Fault::Xid { xid })).unwrap().unwrap();
        }
    });
    let events = gpus.wait_xid_events(Duration::from_millis(1500)).unwrap();
    injector.join().unwrap();
    let got: Vec<(u32, u64)> = events.iter().map(|e| (e.gpu, e.xid)).collect();
    assert_eq!(got, [(0, 48), (1, 79), (1, 94)]);
    assert!(gpus.wait_xid_events(Duration::from_millis(50)).unwrap().is_empty(), "only events after registration");
}

#[test]
fn fixture_xids_reach_every_new_event_set() {
    let node = SimNode::new("node-2x-h200-faulty.toml");
    let gpus = node.gpus();
    for _ in 0..2 {
        let got: Vec<(u32, u64)> = gpus.wait_xid_events(Duration::from_millis(50)).unwrap().iter().map(|e| (e.gpu, e.xid)).collect();
        assert_eq!(got, [(1, 79)]);
    }
}

#[test]
fn missing_library_and_missing_driver_are_distinct_errors() {
    let node = SimNode::new("node-1x-h200.toml");
    let err = NvmlGpus::open(Some(std::path::Path::new("/nonexistent/libnvidia-ml.so.1"))).err().unwrap();
    assert!(matches!(err, GpuError::LibraryMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/libnvidia-ml.so.1"), "{err}");
    std::env::set_var(nvml_sim::store::STATE_ENV, node.state.with_file_name("absent.json"));
    let err = NvmlGpus::open(Some(&common::sim_library())).err().unwrap();
    assert!(matches!(err, GpuError::DriverNotLoaded { .. }), "{err:?}");
}

#[test]
fn inventory_output_is_json_that_reads_back() {
    let node = SimNode::new("node-2x-h200.toml");
    let _ = node.gpus();
    let text = inventory_output(&common::config(), true, Duration::ZERO).unwrap();
    let report: NodeReport = serde_json::from_str(&text).unwrap();
    assert_eq!(report.gpus.len(), 2);
    assert_eq!(report.gpus[1].inventory.as_ref().unwrap().name, "NVIDIA H200");
    let plain = inventory_output(&common::config(), false, Duration::ZERO).unwrap();
    assert!(plain.contains("profile 3g.71gb") && plain.contains("PCIe gen 5/5 width x16/x16"), "{plain}");
}
