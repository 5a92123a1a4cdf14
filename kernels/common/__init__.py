"""deltabench.kernels.common"""
