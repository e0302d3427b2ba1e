"""The base layer: errors and value checks, the LR schedule, the run record, process-group set-up.

Nothing here imports another folder of the project; every other folder may import it.
"""
