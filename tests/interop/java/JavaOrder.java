import java.util.*;
import java.util.concurrent.*;
/**
 * Prints the iteration order of Java's own hash tables, for tests/test_javaorder.py.
 * Each stdin line is "KIND INITIAL KEY...", KIND one of: chm (new ConcurrentHashMap(INITIAL),
 * keys put in order), chmkeyset (ConcurrentHashMap.newKeySet().addAll), hm (new HashMap()),
 * hscopy (new HashSet(list)); each output line is the keys in iteration order.
 */
public class JavaOrder {
    public static void main(String[] a) throws Exception {
        Scanner sc = new Scanner(System.in);
        while (sc.hasNextLine()) {
            String[] p = sc.nextLine().split(" ");
            String kind = p[0]; int init = Integer.parseInt(p[1]);
            List<String> keys = Arrays.asList(p).subList(2, p.length);
            Collection<String> out;
            if (kind.equals("chm")) { Map<String,Integer> m = new ConcurrentHashMap<>(init); for (String k: keys) m.put(k,1); out = m.keySet(); }
            else if (kind.equals("chmkeyset")) { Set<String> s = ConcurrentHashMap.newKeySet(); s.addAll(keys); out = s; }
            else if (kind.equals("hm")) { Map<String,Integer> m = new HashMap<>(); for (String k: keys) m.put(k,1); out = m.keySet(); }
            else { out = new HashSet<>(keys); }
            System.out.println(String.join(" ", out));
        }
    }
}
