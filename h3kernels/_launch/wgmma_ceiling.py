"""The build and launch of cuda_src/wgmma_ceiling.cu (sm_90a only): the e4m3 wgmma ceiling, the
yardstick of the wgmma family (fp8_mma_form 3). h3kernels.peers.wgmma_ceiling times it."""
import dataclasses

from h3kernels._runtime import compiler

SOURCE = "wgmma_ceiling"
ARCH = "sm_90a"  # wgmma exists only on the arch-specific target
ARCHS = (ARCH,)
KERNEL = "h3_wgmma_ceiling"


@dataclasses.dataclass(frozen=True)
class CeilingBuild:
    """cuda_src/wgmma_ceiling.cu's constants: warpgroups per CTA (one m64nN FP32 accumulator
    each), wgmmas per commit group (k_steps: one 128-byte K row of the tiles) and the wgmma's N
    (256 the ceiling; 64 and 128 measure narrower wgmmas)."""
    warpgroups: int = 2
    k_steps: int = 4
    wgmma_n: int = 256
    kernels = (KERNEL,)

    def defines(self):
        return dict(WARPGROUPS=self.warpgroups, K_STEPS=self.k_steps, WGMMA_N=self.wgmma_n)

    def kernel_params(self, name):
        return ("u64", "i32", "u64", "u64")  # sink, iters, a_src, b_src (0: the fixed pattern)

    def dynamic_smem(self, name):
        return 0  # its operand tiles are static shared memory

    @property
    def threads(self):
        return 128 * self.warpgroups

    # the bytes of one CTA's A and B tiles, which a caller's operand source gives per CTA
    a_bytes = 64 * 128
    b_bytes = 256 * 128

    def flops(self, ctas, iters):
        """Tensor FLOPs of one launch of `ctas` CTAs."""
        return ctas * self.warpgroups * iters * self.k_steps * 2 * 64 * self.wgmma_n * 32


def shipped_builds(arch):
    return (CeilingBuild(),) if arch in ARCHS else ()


def kernel(device_id, build=CeilingBuild()):
    """The launcher.Kernel of h3_wgmma_ceiling on a device."""
    return compiler.kernel(SOURCE, KERNEL, ARCH, build, device_id)
