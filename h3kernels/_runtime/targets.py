"""The GPUs we build for: the arch of each compute capability, the device properties the
launches need (read once per device), and the one FP8 mma-form selection both operators use."""
import functools

from h3kernels._errors import fail

ARCH_BY_CC = {(12, 0): "sm_120a", (9, 0): "sm_90", (8, 9): "sm_89"}

# H3_MMA_FORM of cuda_src/fp8_common.cuh: 0 the legacy mma.sync e4m3, 2 kind::mxf8f6f4 with
# unit scales (sm_120a only). kind::f8f6f4 without scales compiles to the same SASS as form 0
# on sm_120a, so it is not offered.
MMA_FORMS = {"sm_120a": (0, 2), "sm_90": (0,), "sm_89": (0,)}


def arch_for(cc):
    cc = tuple(cc)
    if cc in ARCH_BY_CC:  # exact: an sm_120a cubin loads on compute capability 12.0 only
        return ARCH_BY_CC[cc]
    supported = ", ".join(f"sm_{a}{b}" for a, b in ARCH_BY_CC)
    raise ValueError(f"device: compute capability {cc[0]}.{cc[1]} is not supported; need one of {supported}")


@functools.lru_cache(maxsize=None)
def device_properties(device_id):
    """cudaGetDeviceProperties, once per device: it is slow and launches need it every call."""
    import cupy

    props = dict(cupy.cuda.runtime.getDeviceProperties(device_id))
    if isinstance(props.get("name"), bytes):
        props["name"] = props["name"].decode()
    return props


def device_cc(device_id):
    props = device_properties(device_id)
    return props["major"], props["minor"]


@functools.lru_cache(maxsize=None)
def device_arch(device_id):
    return arch_for(device_cc(device_id))


@functools.lru_cache(maxsize=None)
def sm_count(device_id):
    return device_properties(device_id)["multiProcessorCount"]


@functools.lru_cache(maxsize=None)
def board_form(device_id):
    """The form `fp8_mma_form=-1` picks: on GeForce GB202 (sm_120a), kind::mxf8f6f4 issues at
    twice the legacy form's rate; everywhere else the legacy form."""
    if device_arch(device_id) == "sm_120a" and "GeForce" in device_properties(device_id)["name"]:
        return 2
    return 0


def mma_form(device_id, requested=-1):
    """The FP8 mma form for an operator's `fp8_mma_form` (docs/spec.md): -1 the board's, 0 the
    legacy e4m3 mma, 2 kind::mxf8f6f4 (sm_120a only). Both compute the same FP32 sums."""
    if requested == -1 and not isinstance(requested, bool):
        return board_form(device_id)
    if isinstance(requested, bool) or requested not in (0, 2):
        fail("fp8_mma_form", repr(requested), "-1, 0 or 2", ValueError)
    if requested not in MMA_FORMS[device_arch(device_id)]:
        arch = device_arch(device_id)
        fail("fp8_mma_form", requested, f"-1 or 0 on this {arch} board (form 2 needs sm_120a)", ValueError)
    return requested


WGMMA_FORM = 3  # the Hopper families (cuda_src/*_sm90a.cu: wgmma + TMA), sm_90a only
MMA_SYNC, WGMMA = "mma.sync", "wgmma"
# The one map from an fp8_mma_form to the kernel family that runs it: the launch layers, the
# checks and the benches ask form_family() instead of comparing forms.
FAMILY = {0: MMA_SYNC, 2: MMA_SYNC, WGMMA_FORM: WGMMA}
# The forms each arch builds, per family: the mma.sync forms (MMA_FORMS), and the wgmma family
# on compute capability 9.0, where fp8_mma_form=-1 picks it for both operators.
WGMMA_ARCHS = ("sm_90",)


def form_family(form):
    """The instruction family of an fp8_mma_form: 'wgmma' (form 3) or 'mma.sync' (0 and 2)."""
    return FAMILY[form]


def operator_form(device_id, requested=-1):
    """The fp8_mma_form a call of either operator runs for its `fp8_mma_form` argument: -1 the
    wgmma family on compute capability 9.0 (H100, H200), the board's mma.sync form elsewhere;
    0 or 2 as mma_form(); 3 the wgmma family, sm_90a only.

    On sm_90 the wgmma families are the fast ones (the mma.sync e4m3 is emulated there). Their
    tensor cores add each k32 step's products with fewer bits than FP32, so their sums are not
    form 0's bits: the attention meets the same bounds as form 0 (its one-block segments take S
    from mma.sync to hold the 0.005 bound); the MLP meets the stage-wise bounds with its measured
    accumulation term and is held to torch._scaled_mm on the same operands (docs/spec.md)."""
    if not isinstance(requested, bool) and requested in (-1, WGMMA_FORM):
        arch = device_arch(device_id)
        if requested == -1:
            return WGMMA_FORM if arch in WGMMA_ARCHS else board_form(device_id)
        if arch not in WGMMA_ARCHS:
            fail("fp8_mma_form", requested, f"-1, 0 or 2 on this {arch} board (form 3 needs sm_90a)", ValueError)
        return WGMMA_FORM
    return mma_form(device_id, requested)



def offered_forms(op, device_id):
    """The fp8_mma_form values of operator `op` ('mlp' or 'attention') on a device: the one -1
    picks first, then the other families it offers there (what `python -m h3kernels bench` times
    side by side)."""
    arch = device_arch(device_id)
    default = operator_form(device_id, -1)
    others = (0, WGMMA_FORM) if arch in WGMMA_ARCHS else ()
    return (default, *(f for f in others if f != default))
