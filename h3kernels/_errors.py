"""How every argument error reads: the argument's name, what it got and what it needs, raised
as TypeError (not an array of an accepted kind, wrong dtype or Python type) or ValueError
(wrong shape, layout, value or device). The argument checks (h3kernels._validate) and the
runtime's own refusals (an mma form this GPU lacks, a device that is not one) both raise here."""


def fail(name, got, need, exc=ValueError):
    raise exc(f"{name}: got {got}; need {need}")
