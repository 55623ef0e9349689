"""The build and launch of cuda_src/wgmma_ceiling.cu (sm_90a only): the e4m3 wgmma ceiling, the
yardstick of the wgmma family (fp8_mma_form 3). h3kernels.peers.wgmma_ceiling times it."""
from h3kernels._runtime import compiler
from h3kernels._runtime.targets import WGMMA_FORM

ARCH = "sm_90a"  # wgmma exists only on the arch-specific target
ARCHS = (ARCH,)  # what compile_check builds this source for
FORM = WGMMA_FORM  # the family it is the ceiling of
DYNAMIC_SMEM = {}  # its operand tiles are static shared memory

# cuda_src/wgmma_ceiling.cu, built with exactly these (defines()):
WARPGROUPS = 2  # per CTA, one m64n256 FP32 accumulator each (128 registers a thread)
K_STEPS = 4  # m64n256k32 wgmmas per commit group: one 128-byte K row of the tiles
WGMMA_N = 256  # the wgmma's N: 256 (the ceiling), or 64 and 128 (measurement builds of narrower wgmmas)
PARAMS = ("u64", "i32")  # sink, iters


def defines(arch=ARCH, form=FORM, **variant):
    """The -D constants of cuda_src/wgmma_ceiling.cu; `variant` overrides some."""
    d = dict(WARPGROUPS=WARPGROUPS, K_STEPS=K_STEPS, WGMMA_N=WGMMA_N)
    d.update(variant)
    return d


def kernel(device_id, **variant):
    """The launcher.Kernel of h3_wgmma_ceiling on a device, and the defines it was built with."""
    d = defines(**variant)
    ident = ("nvrtc", "wgmma_ceiling", tuple(sorted(d.items())))
    image = lambda: compiler.compile_cubin("wgmma_ceiling", ARCH, d)[0]  # noqa: E731
    return compiler.load_kernel(ident, image, "h3_wgmma_ceiling", device_id, PARAMS), d


def flops(ctas, iters, d):
    """Tensor FLOPs of one launch of `ctas` CTAs built with defines `d`."""
    return ctas * d["WARPGROUPS"] * iters * d["K_STEPS"] * 2 * 64 * d["WGMMA_N"] * 32
