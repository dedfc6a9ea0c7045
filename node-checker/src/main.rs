//! `gpu-mode-node-checker`: Slurm HealthCheckProgram. Its checks arrive with
//! the node-checker issue; until then it reports that it has none and exits 0,
//! so a site that wires it early is never drained by it.
//!
//! `gpu-mode-node-checker inventory [--json] [--config PATH] [--xid-wait-ms N]`
//! prints the GPUs' inventory, modes, MIG profiles and health readings
//! (read-only; the logic is `gpu_mode_core::gpu::report`).

use gpu_mode_core::Config;
use std::path::PathBuf;
use std::time::Duration;

const USAGE: &str = "usage: gpu-mode-node-checker [inventory [--json] [--config PATH] [--xid-wait-ms N]]";

struct InventoryArgs {
    json: bool,
    config: Option<PathBuf>,
    xid_wait: Duration,
}

fn parse_inventory(args: &[String]) -> Result<InventoryArgs, String> {
    let mut parsed = InventoryArgs { json: false, config: None, xid_wait: Duration::from_millis(200) };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => parsed.json = true,
            "--config" => parsed.config = Some(it.next().ok_or("--config needs a path")?.into()),
            "--xid-wait-ms" => {
                let v = it.next().ok_or("--xid-wait-ms needs a number")?;
                parsed.xid_wait = Duration::from_millis(v.parse().map_err(|_| format!("--xid-wait-ms {v:?} is not a number"))?);
            }
            other => return Err(format!("unexpected argument {other:?}")),
        }
    }
    Ok(parsed)
}

fn inventory(args: &[String]) -> Result<String, String> {
    let a = parse_inventory(args)?;
    let config = Config::load(a.config.as_deref()).map_err(|e| e.to_string())?;
    gpu_mode_core::gpu::inventory_output(&config, a.json, a.xid_wait).map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => println!("gpu-mode-node-checker: no checks configured"),
        Some("inventory") => match inventory(&args[1..]) {
            Ok(out) => print!("{out}"),
            Err(e) => {
                eprintln!("gpu-mode-node-checker inventory: {e}");
                std::process::exit(1);
            }
        },
        Some(a) => {
            eprintln!("gpu-mode-node-checker: unexpected argument {a:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
}
