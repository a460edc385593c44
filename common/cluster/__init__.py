"""The cluster: network interfaces, Slurm's task layout, local multi-process clusters, the machine facts each record
carries. Imports only the layers below it."""
