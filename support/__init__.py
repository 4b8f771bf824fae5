"""What the five files (bert, palt, data, train, evaluate) call and a reader can skip: graph files,
flags, checkpoints, devices, downloads, big and sharded rankings, the shortlist, evaluate's command
line."""
