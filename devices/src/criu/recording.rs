//! A CRIU double for tests (like youki's test manager): records every
//! request, answers from a script, and writes plausible image files so the
//! code that sizes, checksums and fsyncs images has something to read.

use super::{Criu, CriuError, CriuVersion, DumpReport, DumpRequest, RestoreReport, RestoreRequest};
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriuCall {
    Check,
    Dump(DumpRequest),
    Restore(RestoreRequest),
}

#[derive(Default)]
pub struct RecordingCriu {
    pub calls: Mutex<Vec<CriuCall>>,
    /// The next dump fails with this error (once).
    pub fail_dump: Mutex<Option<CriuError>>,
    pub fail_restore: Mutex<Option<CriuError>>,
    /// The root pid a restore reports.
    pub restored_pid: Mutex<i32>,
    /// Runs on each dump (e.g. to kill the "dumped" process in a test).
    #[allow(clippy::type_complexity)]
    pub on_dump: Mutex<Option<Box<dyn Fn(&DumpRequest) + Send>>>,
}

impl RecordingCriu {
    pub fn calls(&self) -> Vec<CriuCall> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn record(&self, call: CriuCall) {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(call);
    }
}

impl Criu for RecordingCriu {
    fn check(&self) -> Result<CriuVersion, CriuError> {
        self.record(CriuCall::Check);
        Ok(CriuVersion { major: 4, minor: 1, patch: 1 })
    }

    fn dump(&self, req: &DumpRequest) -> Result<DumpReport, CriuError> {
        self.record(CriuCall::Dump(req.clone()));
        if let Some(hook) = self.on_dump.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            hook(req);
        }
        let log = req.work_dir.join("dump.log");
        if let Some(e) = self.fail_dump.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // A failed dump leaves partial images behind, as CRIU does.
            let _ = std::fs::write(req.images_dir.join("pages-1.img"), b"partial");
            return Err(e);
        }
        for (name, bytes) in [("core-1.img", 512usize), ("pstree.img", 64), ("pages-1.img", 64 << 10)] {
            let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
            std::fs::write(req.images_dir.join(name), data).map_err(|e| CriuError::Other { verb: "dump", detail: e.to_string() })?;
        }
        Ok(DumpReport { ms: 1.0, log })
    }

    fn restore(&self, req: &RestoreRequest) -> Result<RestoreReport, CriuError> {
        self.record(CriuCall::Restore(req.clone()));
        if let Some(e) = self.fail_restore.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let pid = *self.restored_pid.lock().unwrap_or_else(|p| p.into_inner());
        Ok(RestoreReport { pid, ms: 1.0, log: req.work_dir.join("restore.log") })
    }
}
