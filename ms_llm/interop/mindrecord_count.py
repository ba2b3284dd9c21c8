"""How many samples a MindRecord dataset holds (a file, a folder of shards, or an ms_llm dataset folder)."""
import os


def mindrecord_files(path):
    if os.path.isfile(path):
        return [path]
    if os.path.isfile(os.path.join(path, "train.mindrecord")):
        return [os.path.join(path, "train.mindrecord")]
    return sorted(os.path.join(path, f) for f in os.listdir(path)
                  if f.endswith(".mindrecord") or f[-1:].isdigit() and ".mindrecord" in f)


def count(path):
    """Samples in the MindRecord at `path`, or None when there is none to read."""
    files = mindrecord_files(path)
    if not files:
        return None
    import mindspore.dataset as ds

    return ds.MindDataset(files if len(files) > 1 else files[0], shuffle=False).get_dataset_size()
