"""torchless.io.source"""
