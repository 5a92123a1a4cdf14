"""deltabench.web"""
