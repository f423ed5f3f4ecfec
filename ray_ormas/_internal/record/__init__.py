"""The record: its layout and the one reader and writer of its files on any pyarrow filesystem
(segments, parts on object storage, the fleet record, staging). Used by every side; imports
none of them."""
