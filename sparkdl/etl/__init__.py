"""DataVec-style ETL on Spark: sample sources, splits, normalizers."""
