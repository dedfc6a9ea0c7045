//! Carries out a [`Plan`]: services stopped, MIG modes switched (GPUs reset
//! where NVML could not apply the mode itself), instances destroyed and
//! created at the solver's placements, the result read back, services
//! started again in reverse order, also when a step failed. A plan with
//! problems changes nothing. One structured log line per action.

use super::plan::{GpuPlan, Plan};
use super::services::{GpuReset, Services};
use super::{describe, split_instances};
use crate::gpu::{GpuOps, MigModeChange};
use crate::log::{ActionLine, FinishedLine, Outcome};

/// What apply did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// The GPUs already matched: nothing was touched.
    Unchanged,
    /// These GPUs were changed.
    Changed(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyError {
    /// The plan has problems: nothing was changed.
    Refused(Vec<String>),
    /// A step failed; the message says which and what state was left.
    Failed(String),
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Refused(p) => write!(f, "refused, nothing changed: {}", p.join("; ")),
            ApplyError::Failed(m) => f.write_str(m),
        }
    }
}

/// Where log lines go (the config's log in the tool, a vector in tests).
pub type Emit<'a> = &'a mut dyn FnMut(FinishedLine);

fn step(name: &str) -> ActionLine {
    ActionLine::new("mig-baseline").field("step", name)
}

fn done(line: ActionLine, r: &Result<(), String>) -> FinishedLine {
    match r {
        Ok(()) => line.outcome(Outcome::Ok),
        Err(e) => line.field("error", e).outcome(Outcome::Failed),
    }
}

/// Applies `plan` to the GPUs.
pub fn apply(ops: &dyn GpuOps, plan: &Plan, services: &dyn Services, reset: &dyn GpuReset, emit: Emit) -> Result<Done, ApplyError> {
    let problems = plan.problems();
    if !problems.is_empty() {
        return Err(ApplyError::Refused(problems));
    }
    if !plan.changes() {
        return Ok(Done::Unchanged);
    }
    let stopped = match stop_services(&plan.services, services, emit) {
        Ok(list) => list,
        Err((list, e)) => return Err(with_restart(e, start_again(&list, services, emit))),
    };
    let result = change_gpus(ops, plan, reset, emit);
    let restart = start_again(&stopped, services, emit);
    match result {
        Err(e) => Err(with_restart(e, restart)),
        Ok(()) if !restart.is_empty() => Err(ApplyError::Failed(format!("the GPUs were changed, but {}", restart.join("; ")))),
        Ok(()) => Ok(Done::Changed(plan.gpus.iter().filter(|g| g.changes()).map(|g| g.gpu).collect())),
    }
}

fn with_restart(e: String, restart: Vec<String>) -> ApplyError {
    if restart.is_empty() {
        ApplyError::Failed(e)
    } else {
        ApplyError::Failed(format!("{e}; and {}", restart.join("; ")))
    }
}

/// Asks which units are active first, then stops those in list order:
/// stopping one may stop others that depend on it, and those must be
/// started again too. Returns the units stopped (or to start again).
fn stop_services(units: &[String], services: &dyn Services, emit: Emit) -> Result<Vec<String>, (Vec<String>, String)> {
    let mut active = Vec::new();
    for u in units {
        match services.is_active(u) {
            Ok(true) => active.push(u.clone()),
            Ok(false) => {}
            Err(e) => return Err((Vec::new(), format!("cannot tell whether {u} is active: {e}"))),
        }
    }
    for (i, u) in active.iter().enumerate() {
        let r = services.stop(u);
        emit(done(step("stop").field("unit", u), &r));
        if let Err(e) = r {
            return Err((active[..i].to_vec(), format!("cannot stop {u}: {e}")));
        }
    }
    Ok(active)
}

/// Starts `stopped` in reverse order, every one even after a failure;
/// returns the failures.
fn start_again(stopped: &[String], services: &dyn Services, emit: Emit) -> Vec<String> {
    let mut errors = Vec::new();
    for u in stopped.iter().rev() {
        let r = services.start(u);
        emit(done(step("start").field("unit", u), &r));
        if let Err(e) = r {
            errors.push(format!("cannot start {u} again: {e}"));
        }
    }
    errors
}

fn change_gpus(ops: &dyn GpuOps, plan: &Plan, reset: &dyn GpuReset, emit: Emit) -> Result<(), String> {
    switch_modes(ops, plan, reset, emit)?;
    for g in plan.gpus.iter().filter(|g| g.changes()) {
        if g.mode.is_none() {
            destroy(ops, g, emit)?;
        }
        create(ops, g, emit)?;
        verify(ops, g)?;
    }
    Ok(())
}

/// MIG mode changes: instances go first (NVML refuses to turn MIG off
/// while any exist, and a reset would lose them anyway), then the mode;
/// GPUs whose change stays pending are reset together, then checked.
fn switch_modes(ops: &dyn GpuOps, plan: &Plan, reset: &dyn GpuReset, emit: Emit) -> Result<(), String> {
    let mut pending: Vec<&GpuPlan> = Vec::new();
    for g in plan.gpus.iter().filter(|g| g.mode.is_some()) {
        let enable = g.mode == Some(true);
        destroy(ops, g, emit)?;
        let line = step("mig-mode").field("gpu", g.gpu).field("uuid", &g.uuid).field("enable", enable);
        match ops.set_mig_mode(g.gpu, enable) {
            Ok(MigModeChange::Applied) => emit(line.outcome(Outcome::Ok)),
            Ok(MigModeChange::Pending { reason }) => {
                emit(line.field("pending", &reason).outcome(Outcome::Ok));
                pending.push(g);
            }
            Err(e) => {
                let e = format!("GPU {}: cannot switch MIG {}: {e}", g.gpu, if enable { "on" } else { "off" });
                emit(done(line, &Err(e.clone())));
                return Err(e);
            }
        }
    }
    if !pending.is_empty() {
        let ids: Vec<String> = pending.iter().map(|g| g.pci_bus_id.clone()).collect();
        let r = reset.reset(&ids).map_err(|e| format!("GPU reset to apply the MIG mode failed: {e}"));
        emit(done(step("gpu-reset").field("pci", ids.join(",")), &r));
        r?;
    }
    for g in plan.gpus.iter().filter(|g| g.mode.is_some()) {
        let want = g.mode == Some(true);
        let mig = ops.modes(g.gpu).map_err(|e| e.to_string())?.mig;
        if mig.is_none_or(|m| m.current != want) {
            return Err(format!(
                "GPU {}: MIG is still not {} after the reset (modes {mig:?}); a passthrough VM may need a reboot",
                g.gpu,
                if want { "on" } else { "off" }
            ));
        }
    }
    Ok(())
}

fn destroy(ops: &dyn GpuOps, g: &GpuPlan, emit: Emit) -> Result<(), String> {
    for e in &g.destroy {
        let r = ops.destroy_mig_instance(g.gpu, e.gpu_instance).map_err(|err| format!("GPU {}: cannot destroy GI {} ({}): {err}", g.gpu, e.gpu_instance, e.profile));
        emit(done(step("destroy").field("gpu", g.gpu).field("gi", e.gpu_instance).field("profile", &e.profile), &r));
        r?;
    }
    Ok(())
}

/// Creates the plan's instances at their placements; on a failure destroys
/// what this call made (the GPU is then short of its baseline, and the
/// error says so).
fn create(ops: &dyn GpuOps, g: &GpuPlan, emit: Emit) -> Result<(), String> {
    let mut made = Vec::new();
    for p in &g.create {
        let line = step("create").field("gpu", g.gpu).field("profile", &p.name).field("start", p.start);
        match ops.create_mig_instance(g.gpu, p.profile_id, Some(p.start)) {
            Ok(i) => {
                let uuid = i.compute_instances.first().and_then(|c| c.uuid.clone()).unwrap_or_default();
                emit(line.field("gi", i.gpu_instance).field("mig_uuid", uuid).outcome(Outcome::Ok));
                made.push(i.gpu_instance);
            }
            Err(e) => {
                let e = format!("GPU {}: cannot create {} at slice {}: {e}", g.gpu, p.name, p.start);
                emit(done(line, &Err(e.clone())));
                let undone: Vec<String> = made.iter().filter_map(|gi| ops.destroy_mig_instance(g.gpu, *gi).err().map(|x| format!("GI {gi}: {x}"))).collect();
                return Err(match undone.is_empty() {
                    true => format!("{e} (the {} made before it were destroyed again)", made.len()),
                    false => format!("{e}; undoing it failed too: {}", undone.join(", ")),
                });
            }
        }
    }
    Ok(())
}

/// Reads the GPU back: the instances must now be exactly the baseline's.
fn verify(ops: &dyn GpuOps, g: &GpuPlan) -> Result<(), String> {
    let Some(t) = g.target.as_ref().filter(|t| t.mig_enabled) else { return Ok(()) };
    let list = ops.mig_instances(g.gpu).map_err(|e| format!("GPU {}: reading the instances back: {e}", g.gpu))?;
    let profiles = ops.mig_profiles(g.gpu).map_err(|e| format!("GPU {}: reading the profiles back: {e}", g.gpu))?;
    let s = split_instances(Some(t), &list, &profiles, &[]);
    if s.other.is_empty() && s.missing.is_empty() {
        return Ok(());
    }
    let have = super::parted::ExportGpu::new(g.gpu, true, &list, &profiles).instances;
    Err(format!("GPU {}: after apply it has {}, not {}", g.gpu, describe(&have), describe(&t.instances)))
}
