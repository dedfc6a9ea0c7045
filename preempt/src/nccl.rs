//! NCCL's portable-transport mode (`--gpu-mode=checkpoint:nccl=portable`,
//! issue 38): the variables that keep NCCL ranks off what the r580 driver
//! checkpoints but cannot restore (CUDA IPC between processes), in one table
//! that gpu-mode-run sets and the agent checks.
//!
//! Measured on 2×H200 (driver 580.159.04, torch 2.11, NCCL 2.28.9; a
//! 2-rank DDP job over NCCL, both ranks locked and checkpointed by the
//! driver at once at step 10 and restored 2 s later, 30 steps compared
//! bitwise with an uninterrupted run of the same variables:
//! tools/ckpt-bench/apps/nccl_env_probe.py, docs/validation/2026-11-28-s18/):
//! NCCL's defaults: restore 801, the job hangs; the five variables of the
//! first probe: restored, every loss equal; each of the five left out in
//! turn: only without NCCL_P2P_DISABLE does it fail (restore 1, a hang);
//! NCCL_P2P_DISABLE=1 alone: restore 801/999, a hang; NCCL_P2P_DISABLE=1
//! with NCCL_SHM_DISABLE=1: restored, every loss equal. So
//! NCCL_CUMEM_ENABLE=0 and NCCL_CUMEM_HOST_ENABLE=0 are not needed and not
//! set. NCCL_NVLS_ENABLE=0 could not be measured there (NVLink SHARP needs
//! an NVSwitch node; two GPUs never use it) and is kept for the reason its
//! row gives.
//!
//! An override (the job's environment already sets one of them to another
//! value) is kept: gpu-mode-run says on stderr that the job will not be
//! checkpointed, and the agent refuses it at the checkpoint, before anything
//! is locked, so the job starts over. Overwriting would change what the
//! application asked NCCL for without it knowing; refusing keeps both the
//! user's choice and the job's safety.

/// One variable of the mode: its name, the value NCCL must see, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclVar {
    pub name: &'static str,
    pub value: &'static str,
    pub why: &'static str,
}

/// The portable-transport variables (NCCL reads them once, at init).
pub const PORTABLE_ENV: &[NcclVar] = &[
    NcclVar { name: "NCCL_P2P_DISABLE", value: "1", why: "peer-to-peer transport maps the other rank's memory through CUDA IPC (measured: without it the restore fails)" },
    NcclVar {
        name: "NCCL_SHM_DISABLE",
        value: "1",
        why: "the shared-memory transport's buffers are shared between the ranks' processes (measured: with P2P off but SHM on the restore fails)",
    },
    NcclVar {
        name: "NCCL_NVLS_ENABLE",
        value: "0",
        why: "NVLink SHARP buffers are multicast objects shared between processes (not measurable on two GPUs; kept until measured on an NVSwitch node)",
    },
];

/// Task variable with the job's NCCL transport (`native` or `portable`),
/// set by the prolog for gpu-mode-run; the agent has it from its own
/// command line, never from the job.
pub const TASK_NCCL_VAR: &str = "GPU_MODE_CKPT_NCCL";

/// A portable variable the environment sets to another value (or, at the
/// checkpoint, leaves unset: `found` `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub name: &'static str,
    pub want: &'static str,
    pub found: Option<String>,
}

impl std::fmt::Display for Override {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.found {
            Some(v) => write!(f, "{}={v} (the mode needs {}={})", self.name, self.name, self.want),
            None => write!(f, "{} is unset (the mode needs {}={})", self.name, self.name, self.want),
        }
    }
}

/// What gpu-mode-run does to the application's environment in the mode:
/// the variables to set (those the environment `current` leaves unset) and
/// the overrides it keeps.
pub fn plan_portable_env(current: &dyn Fn(&str) -> Option<String>) -> (Vec<(&'static str, &'static str)>, Vec<Override>) {
    let mut set = Vec::new();
    let mut overrides = Vec::new();
    for v in PORTABLE_ENV {
        match current(v.name) {
            None => set.push((v.name, v.value)),
            Some(found) if found == v.value => {}
            Some(found) => overrides.push(Override { name: v.name, want: v.value, found: Some(found) }),
        }
    }
    (set, overrides)
}

/// The first portable variable a process's initial environment
/// (`/proc/<pid>/environ`: NUL-separated `NAME=value`) does not hold at its
/// value. The initial one is what NCCL read at init in the usual case; a
/// process that changed its own environment before NCCL's init is beyond
/// what /proc shows (a restore then fails, docs/preempt.md).
pub fn environ_override(environ: &[u8]) -> Option<Override> {
    let entries: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
    // The first entry of a name, as the C library's getenv finds it.
    let lookup = |name: &str| {
        let prefix = [name.as_bytes(), b"="].concat();
        entries.iter().find_map(|e| e.strip_prefix(prefix.as_slice())).map(|v| String::from_utf8_lossy(v).into_owned())
    };
    PORTABLE_ENV.iter().find_map(|v| match lookup(v.name) {
        Some(found) if found == v.value => None,
        found => Some(Override { name: v.name, want: v.value, found }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn every_variable_has_a_name_a_value_and_a_reason() {
        for v in PORTABLE_ENV {
            assert!(v.name.starts_with("NCCL_") && !v.value.is_empty() && !v.why.is_empty(), "{v:?}");
        }
    }

    #[test]
    fn gpu_mode_run_sets_what_is_unset_and_keeps_overrides() {
        let (set, overrides) = plan_portable_env(&env_of(&[]));
        assert_eq!(set.len(), PORTABLE_ENV.len());
        assert!(overrides.is_empty());
        let (set, overrides) = plan_portable_env(&env_of(&[("NCCL_P2P_DISABLE", "1"), ("NCCL_SHM_DISABLE", "0")]));
        assert!(!set.iter().any(|(n, _)| *n == "NCCL_P2P_DISABLE" || *n == "NCCL_SHM_DISABLE"), "{set:?}");
        assert_eq!(overrides, [Override { name: "NCCL_SHM_DISABLE", want: "1", found: Some("0".into()) }]);
        assert_eq!(overrides[0].to_string(), "NCCL_SHM_DISABLE=0 (the mode needs NCCL_SHM_DISABLE=1)");
    }

    #[test]
    fn the_initial_environment_is_checked_variable_by_variable() {
        let environ = |skip: &str| -> Vec<u8> {
            PORTABLE_ENV.iter().filter(|v| v.name != skip).flat_map(|v| format!("{}={}\0", v.name, v.value).into_bytes()).collect()
        };
        let all = environ("");
        // (environ, the override found: its name and value)
        type Case<'a> = (Vec<u8>, Option<(&'a str, Option<&'a str>)>);
        let table: Vec<Case> = vec![
            (all.clone(), None),
            ([b"HOME=/h\0".as_slice(), &all].concat(), None),
            (Vec::new(), Some(("NCCL_P2P_DISABLE", None))),
            ([b"NCCL_P2P_DISABLE=0\0".as_slice(), &all].concat(), Some(("NCCL_P2P_DISABLE", Some("0")))),
            ([all.as_slice(), b"NCCL_P2P_DISABLE=0\0"].concat(), None),
            (environ("NCCL_NVLS_ENABLE"), Some(("NCCL_NVLS_ENABLE", None))),
            (b"XNCCL_P2P_DISABLE=1\0".to_vec(), Some(("NCCL_P2P_DISABLE", None))),
        ];
        for (environ, want) in table {
            let got = environ_override(&environ);
            assert_eq!(got.as_ref().map(|o| (o.name, o.found.as_deref())), want, "{:?}", String::from_utf8_lossy(&environ));
        }
    }
}
