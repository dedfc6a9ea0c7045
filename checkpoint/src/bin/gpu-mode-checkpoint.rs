//! `gpu-mode-checkpoint`: `gpu-mode-cuda-ckpt` under its old name, installed
//! beside it for one release; it says so on stderr, then does the same.

fn main() {
    eprintln!("{}", gpu_mode_checkpoint::tool::old_name_warning());
    gpu_mode_checkpoint::tool::main()
}
