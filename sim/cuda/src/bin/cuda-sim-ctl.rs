//! `cuda-sim-ctl`: injects faults into the simulated CUDA driver and shows its
//! processes. The directory is `$GPU_MODE_CUDA_SIM_DIR`, or
//! `$GPU_MODE_SIM_STATE.cuda`.
//!
//! ```text
//! cuda-sim-ctl fail <call> [--pid P] [--code N]   the call returns CUDA error N (999 by default)
//! cuda-sim-ctl hang <call> [--pid P]              the call never returns
//! cuda-sim-ctl delay <call> <ms> [--pid P]        the call waits ms first
//! cuda-sim-ctl clear                              no faults
//! cuda-sim-ctl show                               faults and each process's published state
//! ```
//! Calls: get_state, get_restore_thread_id, lock, checkpoint, restore, unlock.
//! Exit 2 on a usage error, 1 when the directory cannot be used.

use cuda_sim::files::{self, Action, Fault, Published, SimDir};

const CALLS: [&str; 6] = ["get_state", "get_restore_thread_id", "lock", "checkpoint", "restore", "unlock"];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err((code, msg)) = run(&args) {
        eprintln!("cuda-sim-ctl: {msg}");
        std::process::exit(code);
    }
}

fn opt(args: &[String], name: &str) -> Result<Option<i64>, (i32, String)> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => {
            let v = args.get(i + 1).ok_or((2, format!("{name} needs a value")))?;
            v.parse().map(Some).map_err(|_| (2, format!("{name} {v}: not a number")))
        }
    }
}

fn run(args: &[String]) -> Result<(), (i32, String)> {
    let sim = SimDir::from_env().map_err(|e| (1, e))?;
    let verb = args.first().map(String::as_str).unwrap_or("");
    if verb == "clear" {
        return sim.set_faults(&[]).map_err(|e| (1, e));
    }
    if verb == "show" {
        show(&sim);
        return Ok(());
    }
    let call = args.get(1).cloned().unwrap_or_default();
    if !CALLS.contains(&call.as_str()) {
        return Err((2, format!("usage: fail|hang|delay <call> [...] | clear | show; calls: {}", CALLS.join(", "))));
    }
    let pid = opt(args, "--pid")?.map(|p| p as i32);
    let action = match verb {
        "fail" => Action::Fail { code: opt(args, "--code")?.unwrap_or(999) as u32 },
        "hang" => Action::Hang,
        "delay" => Action::DelayMs { ms: args.get(2).and_then(|v| v.parse().ok()).ok_or((2, "delay needs <ms>".to_string()))? },
        _ => return Err((2, format!("unknown verb {verb:?}"))),
    };
    let mut faults = sim.faults();
    faults.push(Fault { call, pid, action });
    sim.set_faults(&faults).map_err(|e| (1, e))
}

fn show(sim: &SimDir) {
    for f in sim.faults() {
        println!("fault: {} pid {:?}: {:?}", f.call, f.pid, f.action);
    }
    let Ok(dir) = std::fs::read_dir(sim.root.join("procs")) else { return };
    for entry in dir.flatten() {
        if let Some(p) = files::read_json::<Published>(&entry.path().join("state.json")) {
            let live = files::start_time(p.pid) == Some(p.start_time);
            println!(
                "pid {} {} ({}), restore thread {}, memory {:?}",
                p.pid,
                cuda_sim::api::state_name(p.state),
                if live { "live" } else { "not running" },
                p.restore_tid,
                p.memory
            );
        }
    }
}
