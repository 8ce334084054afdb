package ledger.bench.kstreams;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.message.BinaryMessageDecoder;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * The keyed step of the benchmark: one ledger intent in, one small JSON record out.
 *
 * <p>The same step as the Quix Streams peer ({@code bench/peers/quix_bench.py}), written
 * with the Kafka Streams Processor API. Per input record (key = operation ID, value = the
 * ledger's Avro single-object encoding of an {@code Intent}):
 *
 * <ol>
 *   <li>decode the value with Apache Avro against {@code schemas/intent.avsc} (writer schemas
 *       from {@code schemas/history/intent.v*.avsc} are resolved by their fingerprint, as the
 *       ledger's own decoder does);
 *   <li>read the operation's state from the RocksDB store: version counter, state name and
 *       parameter digest ({@link OpState}); none yet means version 0, no digest,
 *       {@code NOT_ADMITTED};
 *   <li>bump the version, flag drift when the digest differs from the first one seen (the
 *       ledger refuses such an intent), keep the first digest, and write the state back (one
 *       {@code put}: Kafka Streams logs it to the store's changelog topic);
 *   <li>forward exactly one record, key = operation ID, value = the JSON object {@code
 *       {"operation_id", "version", "state", "parameter_digest", "drift"}} (UTF-8), the
 *       fields the Quix peer writes.
 * </ol>
 *
 * <p>Quix keeps the three fields under three keys of its store; here they are one value per
 * operation, the usual shape of a Kafka Streams key-value store.
 */
public final class KeyedStep implements Processor<String, byte[], String, String> {

  /** State of the operation before any intent was seen (the ledger's first state). */
  static final String INITIAL_STATE = "NOT_ADMITTED";

  private final String storeName;
  private final IntentDecoder decoder;
  private ProcessorContext<String, String> context;
  private KeyValueStore<String, byte[]> store;

  /**
   * A step over the store {@code storeName}.
   *
   * @param storeName the key-value store (operation ID to {@link OpState} bytes) this step
   *     was connected to
   * @param decoder the intent decoder (shared: it is read-only after construction)
   */
  public KeyedStep(String storeName, IntentDecoder decoder) {
    this.storeName = storeName;
    this.decoder = decoder;
  }

  @Override
  public void init(ProcessorContext<String, String> context) {
    this.context = context;
    this.store = context.getStateStore(storeName);
  }

  @Override
  public void process(Record<String, byte[]> record) {
    String operationId = record.key();
    String digest = decoder.parameterDigest(record.value());
    byte[] stored = store.get(operationId);
    OpState before = stored == null ? OpState.NONE : OpState.decode(stored);
    boolean drift = before.digest != null && !before.digest.equals(digest);
    OpState after =
        new OpState(
            before.version + 1,
            before.state == null ? INITIAL_STATE : before.state,
            before.digest == null ? digest : before.digest);
    store.put(operationId, after.encode());
    context.forward(record.withValue(json(operationId, after.version, after.state, digest, drift)));
  }

  /**
   * The output value: the JSON object the Quix peer writes, fields in the same order.
   *
   * @return one JSON object, separated as Python's {@code json.dumps} separates them
   */
  static String json(
      String operationId, long version, String state, String digest, boolean drift) {
    StringBuilder out = new StringBuilder(160);
    out.append("{\"operation_id\": ");
    quote(out, operationId);
    out.append(", \"version\": ").append(version).append(", \"state\": ");
    quote(out, state);
    out.append(", \"parameter_digest\": ");
    quote(out, digest);
    out.append(", \"drift\": ").append(drift).append('}');
    return out.toString();
  }

  private static void quote(StringBuilder out, String text) {
    out.append('"');
    for (int i = 0; i < text.length(); i++) {
      char c = text.charAt(i);
      if (c == '"' || c == '\\') {
        out.append('\\').append(c);
      } else if (c < 0x20) {
        out.append(String.format("\\u%04x", (int) c));
      } else {
        out.append(c);
      }
    }
    out.append('"');
  }

  /**
   * One operation's state in the store: version (intents seen), state name, first digest.
   *
   * <p>Encoded as {@code DataOutputStream} fields: the version (8 bytes, big-endian), then
   * the state and the digest as modified UTF-8 with a 2-byte length each (empty for none).
   */
  static final class OpState {
    /** No state yet: version 0, no state name, no digest. */
    static final OpState NONE = new OpState(0, null, null);

    final long version;
    final String state;
    final String digest;

    OpState(long version, String state, String digest) {
      this.version = version;
      this.state = state;
      this.digest = digest;
    }

    byte[] encode() {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream(96);
      try (DataOutputStream out = new DataOutputStream(bytes)) {
        out.writeLong(version);
        out.writeUTF(state == null ? "" : state);
        out.writeUTF(digest == null ? "" : digest);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
      return bytes.toByteArray();
    }

    static OpState decode(byte[] bytes) {
      try (DataInputStream in = new DataInputStream(new ByteArrayInputStream(bytes))) {
        long version = in.readLong();
        String state = in.readUTF();
        String digest = in.readUTF();
        return new OpState(
            version, state.isEmpty() ? null : state, digest.isEmpty() ? null : digest);
      } catch (IOException e) {
        throw new UncheckedIOException("corrupt operation state in the store", e);
      }
    }
  }

  /**
   * Decodes the ledger's intents: Avro single-object encoding ({@code C3 01}, the 8-byte
   * little-endian CRC-64-AVRO fingerprint of the writer schema, then the Avro body).
   *
   * <p>Apache Avro's {@link BinaryMessageDecoder} reads that framing; the reader schema is
   * the current {@code schemas/intent.avsc}, and each older {@code
   * schemas/history/intent.v*.avsc} is added as a writer schema it can resolve from.
   */
  public static final class IntentDecoder {
    private final BinaryMessageDecoder<GenericRecord> decoder;

    /**
     * Load the intent schemas from the ledger's {@code schemas/} folder.
     *
     * @param schemasDir the project's {@code schemas/} folder
     * @throws IOException a schema file cannot be read or parsed
     */
    public IntentDecoder(File schemasDir) throws IOException {
      Schema current = new Schema.Parser().parse(new File(schemasDir, "intent.avsc"));
      decoder = new BinaryMessageDecoder<>(GenericData.get(), current);
      File[] history = new File(schemasDir, "history").listFiles();
      List<File> older = new ArrayList<>();
      if (history != null) {
        for (File f : history) {
          if (f.getName().startsWith("intent.v") && f.getName().endsWith(".avsc")) {
            older.add(f);
          }
        }
      }
      for (File f : older) {
        decoder.addSchema(new Schema.Parser().parse(f));
      }
    }

    /**
     * Decode one intent and return its parameter digest.
     *
     * @param value the record value (single-object encoded {@code Intent})
     * @return the intent's {@code parameter_digest} (SHA-256 hex)
     * @throws IllegalArgumentException the value is not an intent of a known schema
     */
    public String parameterDigest(byte[] value) {
      GenericRecord intent;
      try {
        intent = decoder.decode(ByteBuffer.wrap(value));
      } catch (IOException | RuntimeException e) {
        throw new IllegalArgumentException("not a ledger Intent: " + e, e);
      }
      return intent.get("parameter_digest").toString();
    }
  }
}
