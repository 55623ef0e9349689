"""Torch's own paths timed beside ours, and the mma ceiling of the GPU."""
