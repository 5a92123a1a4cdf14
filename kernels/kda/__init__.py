"""deltabench.kernels.kda"""
