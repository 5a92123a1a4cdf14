"""deltabench.db"""
