"""deltabench.kernels.gdn2"""
