"""The dataset on disk, the sample-exact distributed sampler and the pre/post-processors."""
