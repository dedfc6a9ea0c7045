//! The exported C functions: the subset of libcuda that
//! `core::cuda_ckpt::driver::CudaDriver` loads, with cuda.h's signatures.
//!
//! A cuCheckpointProcess* call from a checkpointer (the agent, root) becomes a
//! request in the target process's folder, answered by that process's driver
//! thread (process.rs), like the real driver works through the target's own
//! driver. Faults from `<dir>/faults.json` apply first: a scripted error, a
//! call that never returns, or a delay.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use crate::codes::{self, state};
use crate::files::{self, Action, Call, Request, Response, SimDir};
use crate::gpus;
use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[repr(C)]
pub struct LockArgs {
    pub timeout_ms: c_uint,
    pub reserved0: c_uint,
    pub reserved1: [u64; 7],
}

#[repr(C)]
pub struct RawGpuPair {
    pub old_uuid: [u8; 16],
    pub new_uuid: [u8; 16],
}

#[repr(C)]
pub struct RestoreArgs {
    pub gpu_pairs: *mut RawGpuPair,
    pub gpu_pairs_count: c_uint,
    pub reserved: [c_char; 44],
    pub reserved1: u64,
}

/// How long a process's driver thread gets to answer a query before the pid
/// is taken for a process without CUDA.
const QUERY_WAIT: Duration = Duration::from_secs(2);
/// How long a live process's folder may take to appear (see `send`).
const PUBLISH_WAIT: Duration = Duration::from_secs(2);
/// Bound on the other calls (the real ones can take minutes for big memory).
const CALL_WAIT: Duration = Duration::from_secs(600);

/// Pids with a call in flight from this process: one call per process at a
/// time, calls on different processes in parallel (as the core makes them).
static BUSY: Mutex<Option<HashSet<i32>>> = Mutex::new(None);
static FREED: Condvar = Condvar::new();

fn guard(f: impl FnOnce() -> Result<(), u32>) -> u32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => codes::SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => codes::UNKNOWN,
    }
}

unsafe fn out<T>(p: *mut T, v: T) -> Result<(), u32> {
    if p.is_null() {
        return Err(codes::INVALID_VALUE);
    }
    p.write(v);
    Ok(())
}

/// Sends `call` to `pid`'s driver thread and waits for its answer.
fn send(pid: i32, call: Call) -> Result<i64, u32> {
    let sim = SimDir::from_env().map_err(|_| codes::NOT_INITIALIZED)?;
    match sim.fault_for(call.name(), pid) {
        Some(Action::Fail { code }) => return Err(code),
        Some(Action::Hang) => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
        Some(Action::DelayMs { ms }) => std::thread::sleep(Duration::from_millis(ms)),
        None => {}
    }
    let dir = sim.proc_dir(pid);
    if files::start_time(pid).is_none() {
        return Err(codes::NOT_INITIALIZED);
    }
    // A process CRIU just restored on another (simulated) node has no folder
    // there until its driver thread republishes (every 500 ms); the real
    // driver is in the process at once, so wait for it rather than refuse.
    let appear = Instant::now();
    while !dir.is_dir() {
        if appear.elapsed() > PUBLISH_WAIT {
            return Err(codes::NOT_INITIALIZED);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let me = unsafe { libc::geteuid() };
    if me != 0 && files::owner(pid) != Some(me) {
        return Err(codes::NOT_PERMITTED);
    }
    let wait = match &call {
        Call::State | Call::RestoreThreadId => QUERY_WAIT,
        Call::Lock { timeout_ms } => Duration::from_millis((*timeout_ms).into()) + QUERY_WAIT,
        _ => CALL_WAIT,
    };
    let _turn = Turn::take(pid);
    let id = files::nanos() ^ ((std::process::id() as u64) << 40);
    files::write_json(&dir.join("request.json"), &Request { id, call }).map_err(|_| codes::UNKNOWN)?;
    let start = Instant::now();
    while start.elapsed() < wait {
        if let Some(r) = files::read_json::<Response>(&dir.join("response.json")).filter(|r| r.id == id) {
            return if r.code == codes::SUCCESS { Ok(r.value) } else { Err(r.code) };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Nothing in that process answers: it has no (simulated) CUDA driver.
    Err(codes::NOT_INITIALIZED)
}

/// This process's turn to call `pid`; released when dropped.
struct Turn(i32);

impl Turn {
    fn take(pid: i32) -> Turn {
        let mut busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
        while busy.get_or_insert_with(HashSet::new).contains(&pid) {
            busy = FREED.wait(busy).unwrap_or_else(|p| p.into_inner());
        }
        busy.get_or_insert_with(HashSet::new).insert(pid);
        Turn(pid)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut busy = BUSY.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(set) = busy.as_mut() {
            set.remove(&self.0);
        }
        FREED.notify_all();
    }
}

fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex = |r: std::ops::Range<usize>| bytes[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", hex(0..4), hex(4..6), hex(6..8), hex(8..10), hex(10..16))
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(_flags: c_uint) -> u32 {
    guard(|| {
        SimDir::from_env().map_err(|_| codes::NO_DEVICE)?;
        gpus::all().map_err(|_| codes::NO_DEVICE).map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> u32 {
    guard(|| out(version, gpus::cuda_version().unwrap_or(13000)))
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: u32, name: *mut *const c_char) -> u32 {
    match codes::describe(code) {
        Some((n, _)) => guard(|| out(name, n.as_ptr() as *const c_char)),
        None => codes::INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: u32, text: *mut *const c_char) -> u32 {
    match codes::describe(code) {
        Some((_, t)) => guard(|| out(text, t.as_ptr() as *const c_char)),
        None => codes::INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetState(pid: c_int, out_state: *mut c_int) -> u32 {
    guard(|| {
        let v = send(pid, Call::State)?;
        out(out_state, v as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessGetRestoreThreadId(pid: c_int, tid: *mut c_int) -> u32 {
    guard(|| {
        let v = send(pid, Call::RestoreThreadId)?;
        out(tid, v as c_int)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args: *mut LockArgs) -> u32 {
    guard(|| {
        // The driver's default when no arguments are given: wait for good.
        let timeout_ms = if args.is_null() { u32::MAX } else { (*args).timeout_ms };
        send(pid, Call::Lock { timeout_ms }).map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(pid: c_int, _args: *mut c_void) -> u32 {
    guard(|| send(pid, Call::Checkpoint).map(|_| ()))
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessRestore(pid: c_int, args: *mut RestoreArgs) -> u32 {
    guard(|| {
        let mut pairs = Vec::new();
        if !args.is_null() && (*args).gpu_pairs_count > 0 {
            if (*args).gpu_pairs.is_null() {
                return Err(codes::INVALID_VALUE);
            }
            let raw = std::slice::from_raw_parts((*args).gpu_pairs, (*args).gpu_pairs_count as usize);
            pairs = raw.iter().map(|p| (uuid_text(&p.old_uuid), uuid_text(&p.new_uuid))).collect();
        }
        send(pid, Call::Restore { pairs }).map(|_| ())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessUnlock(pid: c_int, _args: *mut c_void) -> u32 {
    guard(|| send(pid, Call::Unlock).map(|_| ()))
}

/// The state name a published state holds, for cuda-sim-ctl.
pub fn state_name(s: i32) -> &'static str {
    match s {
        state::RUNNING => "running",
        state::LOCKED => "locked",
        state::CHECKPOINTED => "checkpointed",
        state::FAILED => "failed",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_argument_structs_have_cuda_h_s_layout() {
        assert_eq!(std::mem::size_of::<super::LockArgs>(), 64);
        assert_eq!(std::mem::size_of::<super::RestoreArgs>(), 64);
        assert_eq!(std::mem::size_of::<super::RawGpuPair>(), 32);
    }

    #[test]
    fn uuids_print_as_nvml_does() {
        let mut b = [0u8; 16];
        b[0] = 0x5a;
        b[15] = 0x56;
        assert_eq!(super::uuid_text(&b), "GPU-5a000000-0000-0000-0000-000000000056");
    }
}
