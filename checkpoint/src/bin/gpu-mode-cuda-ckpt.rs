//! `gpu-mode-cuda-ckpt`: the CUDA driver's checkpoint of a job's processes by
//! hand (docs/cuda-ckpt.md); the program is `gpu_mode_checkpoint::tool`.

fn main() {
    gpu_mode_checkpoint::tool::main()
}
