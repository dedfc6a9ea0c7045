//! Wrapper ↔ agent: one JSON object per line over the job's unix socket,
//! each with the protocol version `v`. A request gets one response; a
//! restore gets `restored`, then later `exited` (or `dumped`, when the
//! restored tree was checkpointed again), on the same connection.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const PROTOCOL_VERSION: u32 = 1;
/// No message is near this; a peer sending more is cut off.
const MAX_LINE: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// What the agent knows of this job (is there an image to restore?).
    Hello,
    /// Checkpoint the tree rooted at `root_pid`; `signal_at_ms` is when the
    /// wrapper got the preemption signal (wall clock, ms), for the figures.
    Checkpoint { root_pid: i32, signal_at_ms: Option<u64> },
    /// Restore the job's newest image into the caller's cgroup.
    Restore,
    /// The agent exits (root only: the epilog).
    Stop,
    /// From CRIU's action script at `pre-resume` (agent::hold): may the
    /// restored tree, still held by CRIU, run? Answered with `Proceed` or
    /// an error once the agent has checked it.
    Hold,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageInfo {
    pub restart_count: u32,
    pub node: String,
    pub image_bytes: u64,
    pub created_unix: u64,
}

/// How a process ended, as waitpid told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// The shell's convention: the code, or 128 + the signal.
    pub fn shell_status(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSummary {
    pub image_dir: String,
    pub image_bytes: u64,
    pub gpu_bytes: u64,
    pub cuda_processes: usize,
    pub timings: super::manifest::DumpTimings,
    /// Every phase, from the signal to the durable manifest.
    #[serde(default)]
    pub timeline: super::timeline::Timeline,
    /// Each CUDA process's driver calls, which run side by side: with
    /// several processes, whether all slowed down (a shared resource) or
    /// one held the rest up.
    #[serde(default)]
    pub processes: Vec<ProcessSteps>,
    /// A `pool=on` job's buffers that the driver's checkpoint found
    /// populated in the host memory pool (preempt::pool); 0 without a pool.
    #[serde(default)]
    pub pool_bytes: u64,
    /// Why a first attempt was dropped, when the checkpoint was taken at a
    /// second (a process opened a GPU file after the first's scan).
    #[serde(default)]
    pub first_attempt: Option<String>,
}

/// One CUDA process's lock and checkpoint, as the driver answered them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSteps {
    pub pid: i32,
    pub gpu_bytes: u64,
    pub lock_ms: f64,
    pub checkpoint_ms: f64,
}

impl ProcessSteps {
    /// The report's per-process times, in the order of its processes.
    pub fn of(report: &crate::cuda_ckpt::CheckpointReport) -> Vec<ProcessSteps> {
        use crate::cuda_ckpt::Step;
        let ms = |step: Step, pid: i32| {
            report.phases.iter().filter(|p| p.step == step).flat_map(|p| &p.runs).find(|r| r.pid == pid).map_or(0.0, |r| r.ms)
        };
        report
            .processes
            .iter()
            .map(|p| ProcessSteps { pid: p.pid, gpu_bytes: p.bytes(), lock_ms: ms(Step::Lock, p.pid), checkpoint_ms: ms(Step::Checkpoint, p.pid) })
            .collect()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestoreSummary {
    pub from_restart: u32,
    pub from_node: String,
    pub image_bytes: u64,
    pub check_ms: f64,
    pub criu_restore_ms: f64,
    pub cuda_restore_ms: f64,
    pub total_ms: f64,
    /// Old GPU → new GPU, when the job moved.
    pub device_map: Vec<(String, String)>,
    /// The image was this node's staged copy (staging.rs), not the shared one.
    #[serde(default)]
    pub from_local: bool,
    /// Every phase, from the request to the unlocked processes.
    #[serde(default)]
    pub timeline: super::timeline::Timeline,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    Hello {
        job: u32,
        restart_count: u32,
        image: Option<ImageInfo>,
        criu: Result<String, String>,
        /// Why there is no image although a run was staged (its copy to
        /// shared storage failed or did not come in time: staging.rs).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    Checkpointed(CheckpointSummary),
    Restored { pid: i32, summary: RestoreSummary },
    Exited(ExitInfo),
    /// The restored tree was dumped by a later checkpoint: not an exit.
    Dumped,
    Stopping,
    /// The answer to `Hold`: the restored tree passed its checks.
    Proceed,
    Error { message: String },
    /// The restore failed for a reason of this node's (a pid of the image
    /// is another process's here: security review F7), before anything was
    /// started; the image is kept and another node may restore it.
    NotHere { message: String },
    /// The checkpoint failed after the tree was dumped and killed (sealing
    /// or recording the image): the application is gone and no image was
    /// kept. The job must start over, not end with the killed
    /// application's status.
    TreeLost { message: String },
}

#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    v: u32,
    #[serde(flatten)]
    body: T,
}

pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(&Envelope { v: PROTOCOL_VERSION, body: msg }).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// The next message; `Ok(None)` at end of stream. Another version, a line
/// too long or bad JSON is an error naming it.
pub fn receive<T: for<'de> Deserialize<'de>>(r: &mut impl BufRead) -> std::io::Result<Option<T>> {
    let mut line = Vec::new();
    std::io::Read::take(&mut *r, MAX_LINE).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Ok(None);
    }
    if !line.ends_with(b"\n") {
        return Err(std::io::Error::other(format!("message longer than {MAX_LINE} bytes or cut short")));
    }
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let v: Version = serde_json::from_slice(&line).map_err(|e| std::io::Error::other(format!("bad message: {e}")))?;
    if v.v != PROTOCOL_VERSION {
        return Err(std::io::Error::other(format!(
            "protocol version {} (this side speaks {PROTOCOL_VERSION}): gpu-mode-run and the agent come from different releases",
            v.v
        )));
    }
    let env: Envelope<T> = serde_json::from_slice(&line).map_err(|e| std::io::Error::other(format!("bad message: {e}")))?;
    Ok(Some(env.body))
}

/// Why a request to the job's checkpoint agent (the wrapper's, the bench's)
/// got no answer: the agent not reached, the request not sent, no answer or
/// an unreadable one. The callers say it to the user as text, so each
/// Display is the message they have always shown.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("cannot reach the checkpoint agent at {}: {source}", .socket.display())]
    Connect { socket: PathBuf, source: std::io::Error },
    /// The connection's read timeout or its second handle.
    #[error("{0}")]
    Stream(std::io::Error),
    #[error("{}: {source}", .socket.display())]
    Send { socket: PathBuf, source: std::io::Error },
    #[error("the checkpoint agent closed the connection without an answer")]
    Closed,
    /// The answer unread, too long or not a message of this version.
    #[error("the checkpoint agent: {0}")]
    Answer(std::io::Error),
}

/// One request on a new connection; returns the answer and the reader for
/// any later message. `timeout` bounds the answer (none: the agent bounds
/// its own work).
pub fn request(socket: &Path, req: &Request, timeout: Option<Duration>) -> Result<(Response, BufReader<UnixStream>), AskError> {
    let stream = UnixStream::connect(socket).map_err(|source| AskError::Connect { socket: socket.to_path_buf(), source })?;
    stream.set_read_timeout(timeout).map_err(AskError::Stream)?;
    let mut out = stream.try_clone().map_err(AskError::Stream)?;
    send(&mut out, req).map_err(|source| AskError::Send { socket: socket.to_path_buf(), source })?;
    let mut reader = BufReader::new(stream);
    match receive::<Response>(&mut reader) {
        Ok(Some(r)) => {
            let _ = reader.get_ref().set_read_timeout(None);
            Ok((r, reader))
        }
        Ok(None) => Err(AskError::Closed),
        Err(e) => Err(AskError::Answer(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each process's own lock and checkpoint times, matched by pid, its
    /// GPU bytes summed over its GPUs; an older agent's summary (no field)
    /// reads as none.
    #[test]
    fn a_summary_carries_each_processs_driver_times() {
        use crate::cuda_ckpt::{CheckpointReport, Footprint, FoundBy, GpuUuid, Phase, ProcessPhase, ProcessRecord, Step, StepRun};
        let gpu = |n: u8| GpuUuid::parse(&format!("GPU-00000000-0000-0000-0000-0000000000{n:02x}")).unwrap();
        let record = |pid: i32, gibs: &[(u8, u64)]| ProcessRecord {
            pid,
            start_time: 1,
            footprint: gibs.iter().map(|(g, n)| Footprint { gpu: gpu(*g), bytes: n << 30 }).collect(),
            phase: ProcessPhase::Checkpointed,
            unanswered: None,
        };
        let phase = |step: Step, runs: &[(i32, f64)]| Phase {
            step,
            wall_ms: 0.0,
            runs: runs.iter().map(|(pid, ms)| StepRun { pid: *pid, ms: *ms, result: Ok(()) }).collect(),
        };
        let report = CheckpointReport {
            target: "pids 10".into(),
            found_by: FoundBy::Pid,
            processes: vec![record(10, &[(1, 4)]), record(11, &[(1, 2), (2, 2)])],
            phases: vec![phase(Step::Lock, &[(11, 2.0), (10, 1.0)]), phase(Step::Checkpoint, &[(10, 3000.0), (11, 3300.0)])],
            total_ms: 3300.0,
            record: "/r".into(),
            marks: vec![],
        };
        let steps = ProcessSteps::of(&report);
        let want = [(10, 4u64 << 30, 1.0, 3000.0), (11, 4 << 30, 2.0, 3300.0)];
        let got: Vec<_> = steps.iter().map(|s| (s.pid, s.gpu_bytes, s.lock_ms, s.checkpoint_ms)).collect();
        assert_eq!(got, want);
        let old: CheckpointSummary =
            serde_json::from_str(r#"{"image_dir":"/i","image_bytes":1,"gpu_bytes":0,"cuda_processes":0,"timings":{"cuda_lock_ms":0,"cuda_checkpoint_ms":0,"criu_dump_ms":0,"seal_ms":0,"total_ms":0}}"#).unwrap();
        assert!(old.processes.is_empty());
    }

    #[test]
    fn messages_round_trip_with_their_version() {
        let mut buf = Vec::new();
        send(&mut buf, &Request::Checkpoint { root_pid: 12, signal_at_ms: Some(5) }).unwrap();
        send(&mut buf, &Request::Hello).unwrap();
        assert!(String::from_utf8_lossy(&buf).starts_with(r#"{"v":1,"op":"checkpoint","root_pid":12"#));
        let mut r = std::io::BufReader::new(&buf[..]);
        assert_eq!(receive::<Request>(&mut r).unwrap(), Some(Request::Checkpoint { root_pid: 12, signal_at_ms: Some(5) }));
        assert_eq!(receive::<Request>(&mut r).unwrap(), Some(Request::Hello));
        assert_eq!(receive::<Request>(&mut r).unwrap(), None);
        let mut out = Vec::new();
        send(&mut out, &Response::Exited(ExitInfo { code: None, signal: Some(9) })).unwrap();
        let back: Response = receive(&mut std::io::BufReader::new(&out[..])).unwrap().unwrap();
        assert_eq!(back, Response::Exited(ExitInfo { code: None, signal: Some(9) }));
        assert_eq!(ExitInfo { code: None, signal: Some(9) }.shell_status(), 137);
    }

    /// Security review (issue 18): a peer cannot make the agent hold more
    /// than the bound in memory for one request.
    #[test]
    fn a_message_past_the_bound_is_refused_unread() {
        let huge = vec![b'x'; (MAX_LINE as usize) * 2];
        let mut r = std::io::BufReader::new(&huge[..]);
        let err = receive::<Request>(&mut r).unwrap_err().to_string();
        assert!(err.contains("message longer than 1048576 bytes"), "{err}");
        // The rest was left unread.
        assert_eq!(std::io::Read::bytes(r).count(), huge.len() - MAX_LINE as usize);
    }

    #[test]
    fn other_versions_and_garbage_are_named() {
        let cases: [(&[u8], &str); 4] = [
            (b"{\"v\":2,\"op\":\"hello\"}\n", "protocol version 2 (this side speaks 1)"),
            (b"{\"v\":1,\"op\":\"fly\"}\n", "bad message"),
            (b"not json\n", "bad message"),
            (b"{\"v\":1,\"op\":\"hello\"}", "cut short"),
        ];
        for (bytes, needle) in cases {
            let err = receive::<Request>(&mut std::io::BufReader::new(bytes)).unwrap_err().to_string();
            assert!(err.contains(needle), "{}: {err}", String::from_utf8_lossy(bytes));
        }
    }
    /// An agent not there, one that hangs up, one that answers another
    /// version: each its kind, with the words the wrapper has always said.
    #[test]
    fn a_request_without_an_answer_names_why() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("job-7.sock");
        let err = request(&socket, &Request::Hello, Some(Duration::from_secs(5))).unwrap_err();
        assert!(matches!(&err, AskError::Connect { source, .. } if source.kind() == std::io::ErrorKind::NotFound), "{err:?}");
        assert_eq!(err.to_string(), format!("cannot reach the checkpoint agent at {}: No such file or directory (os error 2)", socket.display()));

        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let agent = std::thread::spawn(move || {
            // Reads the request, then hangs up; then answers the next in version 2.
            let (first, _) = listener.accept().unwrap();
            let _ = receive::<Request>(&mut BufReader::new(&first));
            drop(first);
            let (mut second, _) = listener.accept().unwrap();
            let _ = receive::<Request>(&mut BufReader::new(&second));
            second.write_all(b"{\"v\":2,\"kind\":\"stopping\"}\n").unwrap();
        });
        let err = request(&socket, &Request::Hello, Some(Duration::from_secs(5))).unwrap_err();
        assert!(matches!(err, AskError::Closed), "{err:?}");
        assert_eq!(err.to_string(), "the checkpoint agent closed the connection without an answer");
        let err = request(&socket, &Request::Hello, Some(Duration::from_secs(5))).unwrap_err();
        assert!(matches!(err, AskError::Answer(_)), "{err:?}");
        assert!(err.to_string().starts_with("the checkpoint agent: protocol version 2"), "{err}");
        agent.join().unwrap();

        let table = [
            (AskError::Stream(std::io::Error::from_raw_os_error(libc::EBADF)), "Bad file descriptor (os error 9)"),
            (
                AskError::Send { socket: "/run/gpu-mode/job-7.sock".into(), source: std::io::Error::from_raw_os_error(libc::EPIPE) },
                "/run/gpu-mode/job-7.sock: Broken pipe (os error 32)",
            ),
        ];
        for (err, text) in table {
            assert_eq!(err.to_string(), text, "{err:?}");
        }
    }
}
