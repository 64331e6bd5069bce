package schemareg

// reads is the part of a value the pipelines of a topic read: a node is
// read whole, or only at the fields of its kids. ValueDecoder builds only
// that part of an Avro record or a Protobuf message (decodeAvroPartial,
// decodeProtoPartial) and checks the rest as the whole decode would.
type reads struct {
	whole bool
	kids  map[string]*reads
}

// newReads builds the tree of paths, each read whole; a nil or empty
// path is the whole value.
func newReads(paths [][]string) *reads {
	t := &reads{}
	for _, p := range paths {
		n := t
		for _, name := range p {
			if n.whole {
				break
			}
			if n.kids == nil {
				n.kids = map[string]*reads{}
			}
			k := n.kids[name]
			if k == nil {
				k = &reads{}
				n.kids[name] = k
			}
			n = k
		}
		n.whole, n.kids = true, nil
	}
	return t
}

// ReadOnly tells d that the expressions of its topic read only paths of
// a value (pipeline.Set.ReadPaths): of an Avro record or a Protobuf
// message d then builds only those fields, the values of each exactly as
// the whole decode gives them, and checks the rest of the payload without
// building it. What it refuses stays what the whole decode refuses, with
// the same reason: whenever the partial decode meets anything it does
// not accept, the whole decode decides. Call it before the first record.
func (d *ValueDecoder) ReadOnly(paths [][]string) {
	d.reads = newReads(paths)
	if d.reads.whole {
		d.reads = nil
	}
}
