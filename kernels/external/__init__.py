"""deltabench.kernels.external"""
