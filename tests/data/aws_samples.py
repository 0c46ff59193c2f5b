"""AWS's documented samples of the files this project reads, verbatim, each with its source.

Kept apart from the files this project writes (tests/data/capture) so that a format error
shared by this project's writer and its reader cannot cancel out: the readers must take these
as AWS prints them. Read on 2026-12-07.
"""

__all__ = ["AWS_CAPTURE", "AWS_GROUND_TRUTH"]

# A Data Capture line, verbatim as "Capture data from real-time endpoint" prints it under
# "View Captured Data" (the first of its two lines; a CSV model's input and answer):
# https://docs.aws.amazon.com/sagemaker/latest/dg/model-monitor-data-capture-endpoint.html
# The page breaks the one line between JSON tokens for display: remove the line breaks to
# get the line S3 holds (none falls inside a string).
AWS_CAPTURE = r"""{"captureData":{"endpointInput":{"observedContentType":"text/csv","mode":"INPUT",
"data":"69,0,153.7,109,194.0,105,256.1,114,14.1,6,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,1,0,1,0,1,0\n",
"encoding":"CSV"},"endpointOutput":{"observedContentType":"text/csv; charset=utf-8","mode":"OUTPUT","data":"0.0254181120544672","encoding":"CSV"}},
"eventMetadata":{"eventId":"aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee","inferenceTime":"2022-02-14T17:25:49Z"},"eventVersion":"0"}"""

# A ground-truth record, verbatim as "Ingest Ground Truth labels and merge them with
# predictions" prints it (pretty-printed there; one JSON line in the files Model Monitor reads):
# https://docs.aws.amazon.com/sagemaker/latest/dg/model-monitor-model-quality-merge.html
AWS_GROUND_TRUTH = """{
  "groundTruthData": {
    "data": "1",
    "encoding": "CSV"
  },
  "eventMetadata": {
    "eventId": "aaaa-bbbb-cccc"
  },
  "eventVersion": "0"
}"""
