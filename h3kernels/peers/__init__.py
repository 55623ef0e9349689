"""What ours is measured against: torch's own paths, the FP8 attention kernels of FlashAttention-3
and cuDNN where installed (with the accuracy beside them, fp8_accuracy), and the mma ceilings of
the GPU."""
