"""torchless.jobs.executor"""
