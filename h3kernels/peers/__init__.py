"""What ours is measured against: torch's own paths, the FP8 attention kernels of FlashAttention-3
and cuDNN where installed, and the mma ceilings of the GPU."""
