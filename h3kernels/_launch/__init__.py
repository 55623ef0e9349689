"""_launch"""
