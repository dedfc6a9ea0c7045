//! The report as a human table, as JSON (schema: docs/node-checker.md) and
//! as a Prometheus textfile for node_exporter's textfile collector.

use super::{policy::Action, CheckResult, Status};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// Bump when a field changes meaning or is removed.
pub const REPORT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub version: u32,
    /// The Slurm node name, when known.
    pub node: Option<String>,
    /// Worst status of all results.
    pub status: Status,
    pub duration_ms: u64,
    pub deep: bool,
    pub results: Vec<CheckResult>,
    /// What was done about the node; `None` with --no-drain or no node name.
    pub action: Option<Action>,
    /// Why the action could not be decided or applied.
    pub action_error: Option<String>,
}

impl Report {
    pub fn worst(results: &[CheckResult]) -> Status {
        results.iter().map(|r| r.status).max().unwrap_or(Status::Ok)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"cannot serialize: {e}\"}}")) + "\n"
    }

    pub fn to_table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{:<12} {:<4} {:<8} MESSAGE", "CHECK", "GPU", "STATUS");
        for r in &self.results {
            let gpu = r.gpu.map_or("-".to_string(), |g| g.to_string());
            let _ = writeln!(s, "{:<12} {:<4} {:<8} {}", r.check, gpu, r.status.as_str().to_uppercase(), r.message);
        }
        let action = match (&self.action, &self.action_error) {
            (_, Some(e)) => format!("action: not taken: {e}"),
            (Some(Action::Drain { reason }), _) => format!("action: drained: {reason}"),
            (Some(Action::Resume), _) => "action: resumed".to_string(),
            (Some(Action::Nothing), _) => "action: none needed".to_string(),
            (None, _) => "action: none (--no-drain or no node name)".to_string(),
        };
        let _ = writeln!(s, "overall: {} in {} ms; {action}", self.status.as_str().to_uppercase(), self.duration_ms);
        s
    }

    /// One gauge per check and GPU: 0 ok, 1 warn, 2 fail, -1 skipped.
    pub fn to_prometheus(&self) -> String {
        let mut s = String::from(
            "# HELP gpu_mode_health_status gpu-mode-node-checker result: 0 ok, 1 warn, 2 fail, -1 skipped.\n\
             # TYPE gpu_mode_health_status gauge\n",
        );
        for r in &self.results {
            let v = match r.status { Status::Ok => 0, Status::Warn => 1, Status::Fail => 2, Status::Skipped => -1 };
            let gpu = r.gpu.map_or("node".to_string(), |g| g.to_string());
            let _ = writeln!(s, "gpu_mode_health_status{{check=\"{}\",gpu=\"{gpu}\"}} {v}", r.check);
        }
        let _ = writeln!(s, "# HELP gpu_mode_health_duration_seconds Wall time of the last check run.\n# TYPE gpu_mode_health_duration_seconds gauge");
        let _ = writeln!(s, "gpu_mode_health_duration_seconds {:.3}", self.duration_ms as f64 / 1000.0);
        s
    }

    /// Writes the textfile atomically (node_exporter never sees half a file).
    pub fn write_prometheus(&self, path: &Path) -> Result<(), String> {
        crate::fsutil::write_atomic(path, self.to_prometheus().as_bytes(), 0o644).map_err(|e| format!("writing {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            version: REPORT_VERSION,
            node: Some("n1".into()),
            status: Status::Fail,
            duration_ms: 42,
            deep: false,
            results: vec![
                CheckResult::new("driver", None, Status::Ok, "driver 580"),
                CheckResult::new("memory", Some(1), Status::Fail, "row remap pending"),
                CheckResult::new("fabric", Some(0), Status::Skipped, "none"),
            ],
            action: Some(Action::Drain { reason: "gpu-mode: memory: GPU 1: row remap pending".into() }),
            action_error: None,
        }
    }

    #[test]
    fn json_has_one_object_per_check_and_gpu() {
        let v: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["status"], "fail");
        assert_eq!(v["results"][1], serde_json::json!({"check": "memory", "gpu": 1, "status": "fail", "message": "row remap pending"}));
        assert_eq!(v["results"][0]["gpu"], serde_json::Value::Null);
        assert_eq!(v["action"], serde_json::json!({"kind": "drain", "reason": "gpu-mode: memory: GPU 1: row remap pending"}));
    }

    #[test]
    fn prometheus_and_table() {
        let p = report().to_prometheus();
        for line in ["gpu_mode_health_status{check=\"driver\",gpu=\"node\"} 0", "gpu_mode_health_status{check=\"memory\",gpu=\"1\"} 2", "gpu_mode_health_status{check=\"fabric\",gpu=\"0\"} -1", "gpu_mode_health_duration_seconds 0.042"] {
            assert!(p.lines().any(|l| l == line), "{line} missing in\n{p}");
        }
        let t = report().to_table();
        assert!(t.contains("memory       1    FAIL     row remap pending"), "{t}");
        assert!(t.contains("overall: FAIL in 42 ms; action: drained: gpu-mode: memory"), "{t}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpu.prom");
        report().write_prometheus(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), p);
    }
}
