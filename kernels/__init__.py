"""deltabench.kernels"""
