"""deltabench.kernels.gdn"""
