//! Human-readable reports shared by gpu-mode-cuda-ckpt and the benchmark,
//! and the command line (`cli`).

pub mod cli;
pub mod tool;

use gpu_mode_core::cuda_ckpt::{CheckpointReport, Phase, RecordStatus, RestoreReport, StateReport, Step};

const GIB: f64 = (1u64 << 30) as f64;

/// GiB/s of `bytes` moved in `ms`.
pub fn gib_per_s(bytes: u64, ms: f64) -> f64 {
    if ms <= 0.0 {
        return 0.0;
    }
    bytes as f64 / GIB / (ms / 1000.0)
}

fn phase_line(phases: &[Phase]) -> String {
    phases.iter().map(|p| format!("{} {:.3} s", step_name(p.step), p.wall_ms / 1000.0)).collect::<Vec<_>>().join(", ")
}

/// `checkpointed job 7: 2 process(es), 9.07 GiB of GPU memory in 1.839 s (4.93 GiB/s); lock …`
fn summary(verb: &str, target: &str, n: usize, bytes: u64, ms: f64, phases: &[Phase]) -> String {
    format!(
        "{verb} {target}: {n} process(es), {:.2} GiB of GPU memory in {:.3} s ({:.2} GiB/s); {}",
        bytes as f64 / GIB,
        ms / 1000.0,
        gib_per_s(bytes, ms),
        phase_line(phases)
    )
}

pub fn step_name(step: Step) -> &'static str {
    match step {
        Step::Lock => "lock",
        Step::Checkpoint => "checkpoint",
        Step::Restore => "restore",
        Step::Unlock => "unlock",
    }
}

pub fn describe_checkpoint(r: &CheckpointReport) -> String {
    let mut out = summary("checkpointed", &r.target, r.processes.len(), r.bytes(), r.total_ms, &r.phases);
    out.push_str(&format!("; record {}", r.record.display()));
    for p in &r.processes {
        let gpus: Vec<String> = p.footprint.iter().map(|f| format!("{} {:.2} GiB", f.gpu, f.bytes as f64 / GIB)).collect();
        out.push_str(&format!("\n  pid {}: {}", p.pid, if gpus.is_empty() { "no GPU memory".into() } else { gpus.join(", ") }));
    }
    out
}

pub fn describe_restore(r: &RestoreReport) -> String {
    let mut out = summary("restored", &r.target, r.restored.len(), r.bytes(), r.total_ms, &r.phases);
    if r.record_status != RecordStatus::Complete {
        out.push_str(&format!("\n  from a checkpoint that did not complete (record {})", r.record_status.name()));
    }
    if !r.unlocked_only.is_empty() {
        out.push_str(&format!("\n  unlocked only (restored earlier): {:?}", r.unlocked_only));
    }
    if !r.gone.is_empty() {
        out.push_str(&format!("\n  exited since, nothing to restore: {:?}", r.gone));
    }
    out
}

pub fn describe_state(r: &StateReport) -> String {
    let mut out = format!("{}:", r.target);
    if let Some(rec) = &r.record {
        out.push_str(&format!(" checkpoint record {rec}"));
    }
    if let Some(status) = r.record_status {
        out.push_str(&format!(" ({})", status.name()));
    }
    if r.processes.is_empty() {
        out.push_str("\n  no CUDA process");
    }
    for p in &r.processes {
        let state = p.state.map_or_else(|| "not a CUDA process".to_string(), |s| s.name());
        out.push_str(&format!("\n  pid {}: {state}, {} GPU file(s)", p.pid, p.gpu_files));
        if let Some(tid) = p.restore_thread {
            out.push_str(&format!(", restore thread {tid}"));
        }
        if let Some(phase) = p.phase {
            out.push_str(&format!(", recorded {}", phase.name()));
        }
        if let Some(call) = &p.unanswered {
            out.push_str(&format!(" [{call}]"));
        }
        if let Some(e) = &p.error {
            out.push_str(&format!(" ({e})"));
        }
    }
    out
}
