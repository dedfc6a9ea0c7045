//! placeholder
use super::{CheckResult, Ctx};
use crate::config::DeepConfig;
pub fn run(_ctx: &Ctx, _cfg: &DeepConfig) -> Vec<CheckResult> { Vec::new() }
