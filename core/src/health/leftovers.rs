//! GPU compute processes on a GPU that no job holds: left behind by a job
//! that ended (reparented away from slurmstepd) or started outside Slurm.
//! A GPU is held when a live job state lists it; a process whose ancestors
//! include slurmstepd belongs to a running job even without gpu-mode state
//! (jobs that did not ask for a mode have none).

use super::{per_gpu, Check, CheckResult, Ctx, Status};
use crate::procfs::ProcInfo;

pub struct Leftovers;

const NAME: &str = "leftovers";
const STEPD_COMM: &str = "slurmstepd";

impl Check for Leftovers {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        per_gpu(ctx, NAME, |g, h| {
            if ctx.job_holds(g.index) {
                return CheckResult::new(NAME, Some(g.index), Status::Ok, format!("held by a job ({} process(es))", h.processes.len()));
            }
            let stray: Vec<String> = h
                .processes
                .iter()
                .filter(|p| !under_slurmstepd(p.pid as i32, &ctx.processes))
                .map(|p| describe(p.pid as i32, &ctx.processes))
                .collect();
            match stray.len() {
                0 => CheckResult::new(NAME, Some(g.index), Status::Ok, "no process without a job"),
                n => CheckResult::new(NAME, Some(g.index), Status::Fail, format!("{n} compute process(es) with no job: {}", stray.join(", "))),
            }
        })
    }
}

fn describe(pid: i32, procs: &[ProcInfo]) -> String {
    match procs.iter().find(|p| p.pid == pid) {
        Some(p) => format!("pid {pid} ({}, uid {})", p.comm, p.uid),
        None => format!("pid {pid}"),
    }
}

/// Whether `pid` descends from a slurmstepd (bounded walk: pid loops or
/// a huge tree cannot hang the check).
pub fn under_slurmstepd(pid: i32, procs: &[ProcInfo]) -> bool {
    let mut cur = pid;
    for _ in 0..64 {
        let Some(p) = procs.iter().find(|p| p.pid == cur) else { return false };
        if p.comm == STEPD_COMM {
            return true;
        }
        if p.ppid <= 1 {
            return false;
        }
        cur = p.ppid;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::super::fake::*;
    use super::*;
    use crate::gpu::GpuProcess;

    fn gp(pid: u32) -> GpuProcess {
        GpuProcess { pid, used_memory_mib: Some(10), gpu_instance: None, compute_instance: None }
    }

    #[test]
    fn only_processes_no_job_holds_fail() {
        // (processes on GPU 0, jobs holding GPU 0) -> status, message start
        let cases: Vec<(Vec<u32>, bool, Status, &str)> = vec![
            (vec![], false, Status::Ok, "no process without a job"),
            (vec![4242], false, Status::Fail, "1 compute process(es) with no job: pid 4242 (python, uid 0)"),
            (vec![4242], true, Status::Ok, "held by a job (1 process(es))"),
            (vec![777], false, Status::Ok, "no process without a job"),
            (vec![999], false, Status::Fail, "1 compute process(es) with no job: pid 999"),
        ];
        for (pids, held, status, text) in cases {
            let mut g = healthy_gpu(0);
            g.health.as_mut().unwrap().processes = pids.iter().map(|p| gp(*p)).collect();
            let mut fx = Fixture::new(vec![g, healthy_gpu(1)]);
            fx.processes.extend([process(4242, 1, "python"), process(700, 1, "slurmstepd"), process(777, 700, "python")]);
            if held {
                fx.jobs.push(job(12, &[0], "mps"));
            }
            let r = Leftovers.run(&fx.ctx());
            assert_eq!((r[0].status, r[1].status), (status, Status::Ok), "{r:?}");
            assert!(r[0].message.starts_with(text), "{r:?}");
        }
    }

    #[test]
    fn a_parent_loop_does_not_hang() {
        let procs = [process(5, 6, "a"), process(6, 5, "b")];
        assert!(!under_slurmstepd(5, &procs));
    }
}
