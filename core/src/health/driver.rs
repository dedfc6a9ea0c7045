//! The driver is loaded, NVML initializes, and every GPU answers. A lost GPU
//! (fell off the bus) or one that needs a reset fails with that fix named.

use super::snapshot::ReadError;
use super::{Check, CheckResult, Ctx, Status};

pub struct Driver;

const NAME: &str = "driver";

impl Check for Driver {
    fn name(&self) -> &'static str {
        NAME
    }

    fn run(&self, ctx: &Ctx) -> Vec<CheckResult> {
        let n = match &ctx.nvml {
            Err(e) => return vec![CheckResult::new(NAME, None, Status::Fail, format!("NVML did not initialize: {e}"))],
            Ok(n) => n,
        };
        let version = n.driver.as_ref().map_or("unknown".to_string(), |d| d.driver.clone());
        let mut out = vec![CheckResult::new(NAME, None, Status::Ok, format!("driver {version}, {} GPU(s)", n.gpus.len()))];
        out.extend(n.gpus.iter().map(|g| {
            let (status, text) = match &g.error {
                None => (Status::Ok, "answers".to_string()),
                Some(ReadError::Lost(_)) => (Status::Fail, "GPU lost (fell off the bus): the node needs service".to_string()),
                Some(ReadError::ResetRequired(_)) => (Status::Fail, "GPU needs a reset".to_string()),
                Some(ReadError::Other(e)) => (Status::Fail, format!("cannot read the GPU: {e}")),
            };
            CheckResult::new(NAME, Some(g.index), status, text)
        }));
        out
    }
}
