//! `gpu-mode-man OUTDIR`: writes `<program>.8` for every installed program
//! from its clap definition (the same one the program parses with), so the
//! man pages cannot drift from `--help`. The option's own page, gpu-mode(8),
//! is written by hand (docs/man/gpu-mode.8): it documents a grammar, not a
//! command line; so is gpu-mode-run(1), the users' wrapper, whose command
//! line is the application's (docs/man/gpu-mode-run.1). The checkpoint
//! agent is started by the prolog only and documented in docs/checkpoint.md. The packages install both (Cargo.toml, packaging/).

use gpu_mode_core::lifecycle::{cli, Verb};
use std::path::Path;

/// Every program the packages install, with its command.
pub fn commands() -> Vec<clap::Command> {
    vec![
        cli::command(Verb::Prolog),
        cli::command(Verb::Epilog),
        gpu_mode_node_checker::cli::command(),
        gpu_mode_checkpoint::cli::command(),
        gpu_mode_mig::cli::command(),
        gpu_mode_status::cli::command(),
    ]
}

/// One page, section 8 (they are root's tools), in roff.
pub fn render(cmd: clap::Command) -> std::io::Result<Vec<u8>> {
    let cmd = cmd.version(env!("CARGO_PKG_VERSION"));
    let notes = cmd.get_after_long_help().map(|t| t.to_string());
    let has_subcommands = cmd.has_subcommands();
    let man = clap_mangen::Man::new(cmd)
        .section("8")
        .manual("slurm-gpu-mode")
        .source(concat!("slurm-gpu-mode ", env!("CARGO_PKG_VERSION")));
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    if has_subcommands {
        man.render_subcommands_section(&mut out)?;
    }
    // clap_mangen would title this "EXTRA"; it holds environment and exit codes.
    if let Some(text) = notes {
        out.extend_from_slice(b".SH NOTES\n");
        for para in text.split("\n\n") {
            out.extend_from_slice(format!(".PP\n{}\n", roff_text(para)).as_bytes());
        }
    }
    man.render_version_section(&mut out)?;
    // SEE ALSO: every page points at the option's page.
    out.extend_from_slice(b".SH \"SEE ALSO\"\n\\fBgpu-mode\\fR(8), \\fBslurm.conf\\fR(5), \\fBspank\\fR(8)\n");
    Ok(out)
}

/// Plain text as one roff paragraph: backslashes and minus signs escaped,
/// no line starting with a control character.
fn roff_text(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-").replace('\n', " ");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: gpu-mode-man OUTDIR");
        std::process::exit(2);
    };
    let dir = Path::new(&dir);
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("gpu-mode-man: cannot create {}: {e}", dir.display());
        std::process::exit(1);
    }
    for cmd in commands() {
        let path = dir.join(format!("{}.8", cmd.get_name()));
        if let Err(e) = render(cmd).and_then(|page| std::fs::write(&path, page)) {
            eprintln!("gpu-mode-man: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("{}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_has_a_page_with_its_options() {
        let names: Vec<String> = commands().iter().map(|c| c.get_name().to_string()).collect();
        assert_eq!(names, ["gpu-mode-prolog", "gpu-mode-epilog", "gpu-mode-node-checker", "gpu-mode-cuda-ckpt", "gpu-mode-mig", "gpu-mode-status"]);
        for cmd in commands() {
            let name = cmd.get_name().to_string();
            let page = String::from_utf8(render(cmd).unwrap()).unwrap();
            assert!(page.contains(".TH ") && page.contains(" 8 "), "{name}: no section-8 title");
            assert!(page.contains("\\-\\-config"), "{name}: --config is not documented");
            assert!(page.contains("\\fBgpu-mode\\fR(8)"), "{name}: no SEE ALSO");
        }
    }
}
