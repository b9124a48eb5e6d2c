from torchless.cli.main import entry

entry()
