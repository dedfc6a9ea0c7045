//! The memory test pattern that the node checker's deep check
//! (`health::deep`) and the checkpoint test program (tools/ckpt-bench's
//! `gpu-mode-ckpt-testprog`) write and verify on a GPU: two PTX kernels,
//! `fill` and `verify`, and [`pattern`], the host's computation of the same
//! words, which the test program compares with what the kernels wrote.
//!
//! Word `i` of seed `s` is `(i as u32) * 0x9E3779B1 ^ (i >> 32) as u32 ^ s`:
//! neighbouring words differ in many bits, so a stuck or swapped address line
//! shows, and the pattern of `!s` is the complement of that of `s`. The PTX
//! is written by hand (PTX 8.0, sm_80 and newer) so that a node needs no
//! NVRTC; the driver compiles it for the GPU at load.

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::sync::Arc;

/// Word `i` of the pattern of `seed`, as the kernels compute it.
pub fn pattern(i: u64, seed: u32) -> u32 {
    (i as u32).wrapping_mul(0x9E37_79B1) ^ ((i >> 32) as u32) ^ seed
}

// The grid-stride loop both kernels share: rd1 = buffer, rd2 = n, r1 = seed,
// rd3 = this thread's first index, rd5 = stride; r6 = pattern(rd3), rd7 = &buf[rd3].
macro_rules! grid_loop {
    ($body:literal) => {
        concat!(
            "    ld.param.u64 rd1, [p_buf];\n",
            "    cvta.to.global.u64 rd1, rd1;\n",
            "    ld.param.u64 rd2, [p_n];\n",
            "    ld.param.u32 r1, [p_seed];\n",
            "    mov.u32 r2, %ctaid.x;\n",
            "    mov.u32 r3, %ntid.x;\n",
            "    mov.u32 r4, %tid.x;\n",
            "    mul.wide.u32 rd3, r2, r3;\n",
            "    cvt.u64.u32 rd4, r4;\n",
            "    add.u64 rd3, rd3, rd4;\n",
            "    mov.u32 r5, %nctaid.x;\n",
            "    mul.wide.u32 rd5, r5, r3;\n",
            "LOOP:\n",
            "    setp.ge.u64 p, rd3, rd2;\n",
            "    @p bra DONE;\n",
            "    call (r6), pattern, (rd3, r1);\n",
            "    shl.b64 rd6, rd3, 2;\n",
            "    add.u64 rd7, rd1, rd6;\n",
            $body,
            "    add.u64 rd3, rd3, rd5;\n",
            "    bra.uni LOOP;\n",
            "DONE:\n",
            "    ret;\n",
            "}\n"
        )
    };
}

/// `fill(buf, n, seed)`: buf[i] = pattern(i, seed) for i < n;
/// `verify(buf, n, seed, bad)`: adds to *bad the number of words i < n that differ.
pub const PTX: &str = concat!(
    r#"
.version 8.0
.target sm_80
.address_size 64

.func (.reg .b32 v) pattern(.reg .b64 i, .reg .b32 seed)
{
    .reg .b32 lo, hi;
    .reg .b64 t;
    cvt.u32.u64 lo, i;
    mul.lo.u32 lo, lo, 0x9E3779B1;
    shr.u64 t, i, 32;
    cvt.u32.u64 hi, t;
    xor.b32 lo, lo, hi;
    xor.b32 v, lo, seed;
    ret;
}

.visible .entry fill(.param .u64 p_buf, .param .u64 p_n, .param .u32 p_seed)
{
    .reg .pred p;
    .reg .b32 r<8>;
    .reg .b64 rd<12>;
"#,
    grid_loop!("    st.global.u32 [rd7], r6;\n"),
    r#"
.visible .entry verify(.param .u64 p_buf, .param .u64 p_n, .param .u32 p_seed, .param .u64 p_bad)
{
    .reg .pred p, q;
    .reg .b32 r<8>;
    .reg .b64 rd<12>;
    ld.param.u64 rd9, [p_bad];
    cvta.to.global.u64 rd9, rd9;
"#,
    grid_loop!("    ld.global.u32 r7, [rd7];\n    setp.ne.u32 q, r7, r6;\n    @q atom.global.add.u64 rd10, [rd9], 1;\n"),
);

/// The two kernels, loaded into one CUDA context.
pub struct PatternKernels {
    fill: CudaFunction,
    verify: CudaFunction,
}

/// A grid-stride launch: 8 blocks of 256 threads per SM of the largest GPUs
/// (132 SMs on an H100 SXM); smaller GPUs just queue more blocks.
fn launch_config() -> LaunchConfig {
    LaunchConfig { grid_dim: (132 * 8, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

impl PatternKernels {
    pub fn load(ctx: &Arc<CudaContext>) -> Result<PatternKernels, DriverError> {
        let module = ctx.load_module(Ptx::from_src(PTX))?;
        Ok(PatternKernels { fill: module.load_function("fill")?, verify: module.load_function("verify")? })
    }

    /// Queues the fill of all of `buf` with the pattern of `seed` on `stream`.
    pub fn fill(&self, stream: &Arc<CudaStream>, buf: &mut CudaSlice<u32>, seed: u32) -> Result<(), DriverError> {
        let n = buf.len() as u64;
        let mut b = stream.launch_builder(&self.fill);
        b.arg(buf).arg(&n).arg(&seed);
        // SAFETY: fill's parameters are (u64 buffer, u64 n, u32 seed), and
        // n is the buffer's length in words.
        unsafe { b.launch(launch_config()) }.map(|_| ())
    }

    /// Words among the first `n` of `buf` that differ from the pattern of
    /// `seed` (after what `stream` has queued).
    pub fn mismatches(&self, stream: &Arc<CudaStream>, buf: &CudaSlice<u32>, n: u64, seed: u32) -> Result<u64, DriverError> {
        let n = n.min(buf.len() as u64);
        let mut bad = stream.alloc_zeros::<u64>(1)?;
        let mut b = stream.launch_builder(&self.verify);
        b.arg(buf).arg(&n).arg(&seed).arg(&mut bad);
        // SAFETY: verify's parameters are (u64 buffer, u64 n, u32 seed, u64
        // counter), n at most the buffer's length, the counter one word.
        unsafe { b.launch(launch_config()) }?;
        Ok(stream.clone_dtoh(&bad)?.first().copied().unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_pattern_is_the_kernels_formula() {
        // Values worked out by hand from the PTX's steps (lo * 0x9E3779B1, ^ hi, ^ seed).
        assert_eq!(pattern(0, 0), 0);
        assert_eq!(pattern(1, 0), 0x9E37_79B1);
        assert_eq!(pattern(2, 0), 0x3C6E_F362);
        assert_eq!(pattern(1 << 32, 0), 1);
        assert_eq!(pattern(1, 0xFFFF_FFFF), !0x9E37_79B1);
        // Neighbours differ in many bits; the complement seed complements every word.
        for i in [0u64, 7, 1 << 20, (1 << 33) + 5] {
            assert!((pattern(i, 0) ^ pattern(i + 1, 0)).count_ones() >= 8, "word {i}");
            assert_eq!(pattern(i, 0x5a5a_1234), !pattern(i, !0x5a5a_1234));
        }
    }

    #[test]
    fn the_ptx_has_both_kernels_and_the_shared_function() {
        for name in [".visible .entry fill(", ".visible .entry verify(", ".func (.reg .b32 v) pattern("] {
            assert_eq!(PTX.matches(name).count(), 1, "{name}");
        }
        assert_eq!(PTX.matches("call (r6), pattern, (rd3, r1);").count(), 2);
    }
}
