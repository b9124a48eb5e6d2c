"""Object stores' own server-side operations (joins, copies, clean-up) beside fsspec:
S3 multipart joins (:mod:`.s3`), Azure block staging and copies (:mod:`.azure`)."""
