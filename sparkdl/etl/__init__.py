"""DataVec-style ETL on Spark: record readers, transform processes, analysis, normalizers,
the non-finite values policy, sample sources and splits."""
