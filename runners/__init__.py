"""deltabench.runners"""
