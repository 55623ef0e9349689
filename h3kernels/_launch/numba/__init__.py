"""_launch/numba"""
