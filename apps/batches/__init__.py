"""Batches (OpenAI's /v1/files and /v1/batches): a file of requests run on the fleet's spare
capacity, at the lowest priority tier and the batch price, through the gateway's own pipeline.

The HTTP endpoints (consumers) store files and batches; Celery's `batches` queue validates a
batch's file into lines, runs them (runner: the pipeline in the worker's event loop) and writes
the output and error files. Everything a run needs is in PostgreSQL, so a worker lost mid-batch
loses nothing: the next one takes the batch over once its lease lapses.
"""
