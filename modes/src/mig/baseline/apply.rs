//! Carries out a [`Plan`]: services stopped, MIG modes switched (GPUs reset
//! where NVML could not apply the mode itself), instances destroyed and
//! created at the solver's placements, the result read back, services
//! started again in reverse order, also when a step failed. A plan with
//! problems changes nothing. One structured log line per action.

use super::plan::{GpuPlan, Plan};
use super::services::{GpuReset, ProgramError, Services};
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

/// Why an apply did not bring the GPUs to the baseline.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The plan has problems: nothing was changed.
    #[error("refused, nothing changed: {}", .0.join("; "))]
    Refused(Vec<String>),
    /// A step failed (and the services stopped for it were started again,
    /// or `restart` says which were not).
    #[error("{step}{}", restart_failures(.restart, "; and "))]
    Failed { step: StepError, restart: Vec<String> },
    /// The GPUs were changed, but services could not be started again.
    #[error("the GPUs were changed, but {}", .0.join("; "))]
    NotRestarted(Vec<String>),
}

/// The step of an apply that failed, with what it was acting on.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("cannot tell whether {unit} is active: {source}")]
    ServiceState { unit: String, source: ProgramError },
    #[error("cannot stop {unit}: {source}")]
    ServiceStop { unit: String, source: ProgramError },
    #[error("GPU {gpu}: cannot switch MIG {}: {detail}", on_off(*.enable))]
    MigMode { gpu: u32, enable: bool, detail: String },
    #[error("GPU reset to apply the MIG mode failed: {0}")]
    Reset(#[source] ProgramError),
    #[error("GPU {gpu}: MIG is still not {} after the reset ({modes}); a passthrough VM may need a reboot", on_off(*.enable))]
    ModeNotApplied { gpu: u32, enable: bool, modes: String },
    #[error("GPU {gpu}: cannot destroy GI {gpu_instance} ({profile}): {detail}")]
    Destroy { gpu: u32, gpu_instance: u32, profile: String, detail: String },
    /// `undone`: the instances this step made before, destroyed again
    /// (`Ok(count)`) or not (`Err`: what failed).
    #[error("GPU {gpu}: cannot create {profile} at slice {start}: {detail}{}", undo_said(.undone))]
    Create { gpu: u32, profile: String, start: u32, detail: String, undone: Result<usize, String> },
    /// The GPU could not be read back, or does not match the baseline.
    #[error("GPU {gpu}: {detail}")]
    Verify { gpu: u32, detail: String },
}

impl ApplyError {
    /// The metric label of a drain this failure set (`gpu-mode-mig apply
    /// --boot`): the kind of step, never words of the message.
    pub fn label(&self) -> &'static str {
        match self {
            ApplyError::Refused(_) => "refused",
            ApplyError::NotRestarted(_) => "services",
            ApplyError::Failed { step, .. } => step.label(),
        }
    }
}

impl StepError {
    pub fn label(&self) -> &'static str {
        match self {
            StepError::ServiceState { .. } | StepError::ServiceStop { .. } => "services",
            StepError::MigMode { .. } | StepError::ModeNotApplied { .. } => "mig_mode",
            StepError::Reset(_) => "gpu_reset",
            StepError::Destroy { .. } => "destroy",
            StepError::Create { .. } => "create",
            StepError::Verify { .. } => "verify",
        }
    }
}

fn on_off(enable: bool) -> &'static str {
    if enable { "on" } else { "off" }
}

fn restart_failures(restart: &[String], lead: &str) -> String {
    if restart.is_empty() { String::new() } else { format!("{lead}{}", restart.join("; ")) }
}

fn undo_said(undone: &Result<usize, String>) -> String {
    match undone {
        Ok(made) => format!(" (the {made} made before it were destroyed again)"),
        Err(e) => format!("; undoing it failed too: {e}"),
    }
}

/// Where log lines go (the config's log in the tool, a vector in tests).
pub type Emit<'a> = &'a mut dyn FnMut(FinishedLine);

fn step(name: &str) -> ActionLine {
    ActionLine::new("mig-baseline").field("step", name)
}

fn done<E: std::fmt::Display>(line: ActionLine, r: &Result<(), E>) -> FinishedLine {
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
        Err((list, step)) => return Err(ApplyError::Failed { step, restart: start_again(&list, services, emit) }),
    };
    let result = change_gpus(ops, plan, reset, emit);
    let restart = start_again(&stopped, services, emit);
    match result {
        Err(step) => Err(ApplyError::Failed { step, restart }),
        Ok(()) if !restart.is_empty() => Err(ApplyError::NotRestarted(restart)),
        Ok(()) => Ok(Done::Changed(plan.gpus.iter().filter(|g| g.changes()).map(|g| g.gpu).collect())),
    }
}

/// Asks which units are active first, then stops those in list order:
/// stopping one may stop others that depend on it, and those must be
/// started again too. Returns the units stopped (or to start again).
fn stop_services(units: &[String], services: &dyn Services, emit: Emit) -> Result<Vec<String>, (Vec<String>, StepError)> {
    let mut active = Vec::new();
    for u in units {
        match services.is_active(u) {
            Ok(true) => active.push(u.clone()),
            Ok(false) => {}
            Err(source) => return Err((Vec::new(), StepError::ServiceState { unit: u.clone(), source })),
        }
    }
    for (i, u) in active.iter().enumerate() {
        let r = services.stop(u);
        emit(done(step("stop").field("unit", u), &r));
        if let Err(source) = r {
            return Err((active[..i].to_vec(), StepError::ServiceStop { unit: u.clone(), source }));
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

fn change_gpus(ops: &dyn GpuOps, plan: &Plan, reset: &dyn GpuReset, emit: Emit) -> Result<(), StepError> {
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
fn switch_modes(ops: &dyn GpuOps, plan: &Plan, reset: &dyn GpuReset, emit: Emit) -> Result<(), StepError> {
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
                let e = StepError::MigMode { gpu: g.gpu, enable, detail: e.to_string() };
                emit(done(line, &Err(&e)));
                return Err(e);
            }
        }
    }
    if !pending.is_empty() {
        let ids: Vec<String> = pending.iter().map(|g| g.pci_bus_id.clone()).collect();
        let r = reset.reset(&ids).map_err(StepError::Reset);
        emit(done(step("gpu-reset").field("pci", ids.join(",")), &r));
        r?;
    }
    for g in plan.gpus.iter().filter(|g| g.mode.is_some()) {
        let want = g.mode == Some(true);
        let mig = ops.modes(g.gpu).map_err(|e| StepError::Verify { gpu: g.gpu, detail: format!("reading the MIG mode back: {e}") })?.mig;
        if mig.is_none_or(|m| m.current != want) {
            return Err(StepError::ModeNotApplied { gpu: g.gpu, enable: want, modes: format!("modes {mig:?}") });
        }
    }
    Ok(())
}

fn destroy(ops: &dyn GpuOps, g: &GpuPlan, emit: Emit) -> Result<(), StepError> {
    for e in &g.destroy {
        let r = ops.destroy_mig_instance(g.gpu, e.gpu_instance).map_err(|err| StepError::Destroy {
            gpu: g.gpu,
            gpu_instance: e.gpu_instance,
            profile: e.profile.clone(),
            detail: err.to_string(),
        });
        emit(done(step("destroy").field("gpu", g.gpu).field("gi", e.gpu_instance).field("profile", &e.profile), &r));
        r?;
    }
    Ok(())
}

/// Creates the plan's instances at their placements; on a failure destroys
/// what this call made (the GPU is then short of its baseline, and the
/// error says so).
fn create(ops: &dyn GpuOps, g: &GpuPlan, emit: Emit) -> Result<(), StepError> {
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
                let detail = format!("{e}");
                emit(done(line, &Err(format!("GPU {}: cannot create {} at slice {}: {detail}", g.gpu, p.name, p.start))));
                let failed: Vec<String> = made.iter().filter_map(|gi| ops.destroy_mig_instance(g.gpu, *gi).err().map(|x| format!("GI {gi}: {x}"))).collect();
                let undone = if failed.is_empty() { Ok(made.len()) } else { Err(failed.join(", ")) };
                return Err(StepError::Create { gpu: g.gpu, profile: p.name.clone(), start: p.start, detail, undone });
            }
        }
    }
    Ok(())
}

/// Reads the GPU back: the instances must now be exactly the baseline's.
fn verify(ops: &dyn GpuOps, g: &GpuPlan) -> Result<(), StepError> {
    let Some(t) = g.target.as_ref().filter(|t| t.mig_enabled) else { return Ok(()) };
    let verify = |detail: String| StepError::Verify { gpu: g.gpu, detail };
    let list = ops.mig_instances(g.gpu).map_err(|e| verify(format!("reading the instances back: {e}")))?;
    let profiles = ops.mig_profiles(g.gpu).map_err(|e| verify(format!("reading the profiles back: {e}")))?;
    let s = split_instances(Some(t), &list, &profiles, &[]);
    if s.other.is_empty() && s.missing.is_empty() {
        return Ok(());
    }
    let have = super::parted::ExportGpu::new(g.gpu, true, &list, &profiles).instances;
    Err(verify(format!("after apply it has {}, not {}", describe(&have), describe(&t.instances))))
}
